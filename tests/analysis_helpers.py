"""What the tests of `report` and `compare` share: each command called in-process,
its exit code, standard output and standard error."""

import io

from commbench.analysis import compare, report


def run_report(paths, fmt="text"):
    out, err = io.StringIO(), io.StringIO()
    code = report.report(paths, fmt, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def run_compare(base, new, **kw):
    out, err = io.StringIO(), io.StringIO()
    code = compare.compare(str(base), str(new), out=out, err=err, **kw)
    return code, out.getvalue(), err.getvalue()
