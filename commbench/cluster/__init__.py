"""Emulated clusters: N machines on one Linux host, each a network namespace with its
own hostname (a UTS namespace), joined by a bridge through links whose rate is capped
in both directions (tc tbf), reached by launchers through an `ssh` stand-in.

namespaces.py makes and removes one (with `ip` and `tc`) on host.py's tools, shaping.py
caps its links, state.py is what one is and where it is kept, ssh.py is the stand-in,
and command.py is `commbench cluster up|down|status`.
"""
