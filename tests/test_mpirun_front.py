"""`commbench setup-mpirun`: the front that lets Open MPI 5's mpirun take Open MPI 4's
one-dash -bind-to/-map-by/-rank-by — the respelling itself, installing and removing it,
and Horovod's habitual mpirun line run as typed through the installed front."""

from pathlib import Path

import pytest

from commbench.errors import UsageError
from commbench.launch.mpirun_front.arguments import rewrite
from commbench.launch.mpirun_front.install import install, is_front, remove
from launchers import BIN, PYTHON, TINY_RUN, only_result, run


@pytest.mark.parametrize("typed, meant", [
    (["-np", "4", "-bind-to", "none", "-map-by", "slot", "python", "train.py"],
     ["-np", "4", "--bind-to", "none", "--map-by", "slot", "python", "train.py"]),
    # Horovod's line: values of -x and -mca are skipped, the program's arguments untouched.
    (["-np", "2", "-H", "a:1,b:1", "-bind-to", "none", "-map-by", "slot", "-x", "NCCL_DEBUG=INFO",
      "-mca", "pml", "ob1", "-rank-by", "core", "python", "t.py", "-map-by", "-bind-to"],
     ["-np", "2", "-H", "a:1,b:1", "--bind-to", "none", "--map-by", "slot", "-x", "NCCL_DEBUG=INFO",
      "-mca", "pml", "ob1", "--rank-by", "core", "python", "t.py", "-map-by", "-bind-to"]),
    # what Open MPI 5 already accepts is passed on as typed
    (["--bind-to", "none", "-np", "2", "--map-by=slot", "-x", "-map-by", "prog"],
     ["--bind-to", "none", "-np", "2", "--map-by=slot", "-x", "-map-by", "prog"]),
    (["-mca", "btl", "-bind-to", "prog", "-bind-to"],
     ["-mca", "btl", "-bind-to", "prog", "-bind-to"]),
    # an unknown option is taken as a flag: at worst the scan stops early, never late
    (["--new-flag", "value", "-bind-to", "none", "prog"],
     ["--new-flag", "value", "-bind-to", "none", "prog"]),
    ([], []),
])
def test_only_open_mpi_4_spellings_before_the_program_are_rewritten(typed, meant):
    assert rewrite(typed) == meant


@pytest.mark.parametrize("typed, meant", [
    (["-n", "4", "python", "-m", "commbench", "--recovery", "gossip"],
     ["--enable-recovery", "-n", "4", "python", "-m", "commbench", "--recovery", "gossip"]),
    (["-n", "4", "--with-ft", "ulfm", "prog", "--recovery=gossip"],
     ["-n", "4", "--with-ft", "ulfm", "prog", "--recovery=gossip"]),
    (["-n", "4", "prog", "--recovery", "restart", "gossip"],
     ["-n", "4", "prog", "--recovery", "restart", "gossip"]),
])
def test_a_job_that_asks_for_gossips_survivors_gets_prrtes_recovery_unless_it_asked(
        typed, meant):
    assert rewrite(typed) == meant


def fake_mpi(bin_dir: Path, version_line: str) -> None:
    """A bin/ with an mpirun and mpiexec that print a version or the arguments they got."""
    bin_dir.mkdir()
    for name in ("mpirun", "mpiexec"):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo '{version_line}' && exit 0\n"
                        f"echo {name}: \"$@\"\n")
        path.chmod(0o755)


@pytest.mark.mpi  # runs programs named mpirun (fakes)
def test_install_is_idempotent_runs_the_real_one_and_removes_cleanly(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_mpi(bin_dir, "mpirun (Open MPI) 5.0.11")
    said = install(bin_dir)
    assert all("front installed" in line for line in said) and len(said) == 2
    assert is_front(bin_dir / "mpirun") and (bin_dir / "mpirun.openmpi").exists()
    assert all("already in place" in line for line in install(bin_dir))
    done = run([str(bin_dir / "mpirun"), "-np", "2", "-bind-to", "none", "prog", "-bind-to"], 60)
    assert done.stdout == "mpirun: -np 2 --bind-to none prog -bind-to\n", done.stderr
    assert install(bin_dir) and remove(bin_dir)
    assert not is_front(bin_dir / "mpirun") and not (bin_dir / "mpirun.openmpi").exists()
    assert "echo mpirun" in (bin_dir / "mpirun").read_text()


@pytest.mark.mpi
def test_an_upgrade_that_puts_the_real_mpirun_back_is_fronted_again(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_mpi(bin_dir, "mpirun (Open MPI) 5.0.11")
    install(bin_dir)
    upgraded = "#!/bin/sh\necho 'mpirun (Open MPI) 5.0.12'\n"
    (bin_dir / "mpirun").write_text(upgraded)  # as pip would
    (bin_dir / "mpirun").chmod(0o755)
    assert install(bin_dir)[0] == f"{bin_dir / 'mpirun'}: front installed " \
                                  f"(real: {bin_dir / 'mpirun.openmpi'})"
    assert (bin_dir / "mpirun.openmpi").read_text() == upgraded


@pytest.mark.mpi
def test_open_mpi_4_needs_no_front_and_other_mpis_are_refused(tmp_path):
    fake_mpi(tmp_path / "four", "mpirun (Open MPI) 4.1.6")
    assert all("no front needed" in line for line in install(tmp_path / "four"))
    assert not is_front(tmp_path / "four" / "mpirun")
    fake_mpi(tmp_path / "mpich", "HYDRA build details:")
    with pytest.raises(UsageError, match="not Open MPI's"):
        install(tmp_path / "mpich")
    with pytest.raises(UsageError, match="pip install 'commbench\\[mpi\\]'"):
        install(tmp_path / "nothing")


@pytest.mark.mpi  # starts programs named mpirun (fakes) and one single-process run
@pytest.mark.timeout(240)
def test_list_and_run_name_the_fix_while_open_mpi_5_has_no_front(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_mpi(bin_dir, "mpirun (Open MPI) 5.0.11")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    fix = f"`commbench setup-mpirun --bin-dir {bin_dir}` fixes it"
    listed = run([PYTHON, "-m", "commbench", "list"], 120, env=env)
    assert listed.returncode == 0, listed.stderr
    warning = listed.stdout.splitlines()[-1]
    assert warning.startswith(f"Warning: {bin_dir / 'mpirun'} is Open MPI 5 without") and \
        warning.endswith(fix), listed.stdout
    ran = run([PYTHON, "-m", "commbench", *TINY_RUN, "--results-dir", str(tmp_path / "r")], 180,
              env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert sum(fix in line for line in ran.stdout.splitlines()) == 1, ran.stdout
    install(bin_dir)
    listed = run([PYTHON, "-m", "commbench", "list"], 120, env=env)
    assert "Warning" not in listed.stdout
    four = tmp_path / "four"
    fake_mpi(four, "mpirun (Open MPI) 4.1.6")
    listed = run([PYTHON, "-m", "commbench", "list"], 120, env={"PATH": f"{four}:/usr/bin:/bin"})
    assert "Warning" not in listed.stdout


def front_or_fail() -> Path:
    mpirun = BIN / "mpirun"
    if not is_front(mpirun):
        pytest.fail(f"{mpirun} is not commbench's front: run `commbench setup-mpirun` "
                    "(docs/install.md)")
    return mpirun


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_horovods_habitual_mpirun_line_runs_as_typed(tmp_path):
    front_or_fail()
    cmd = ["mpirun", "-np", "2", "-bind-to", "none", "-map-by", "slot", "-x", "OMP_NUM_THREADS=1",
           "python", "-m", "commbench", "--dist-optimizer=allreduce", *TINY_RUN]
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "OMP_NUM_THREADS": "4"}
    done = run(cmd, 240, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path / "results")
    assert doc["environment"]["launcher"] == "openmpi"
    assert doc["environment"]["world_size"] == 2
    assert doc["environment"]["torch_threads"] == 1  # -x OMP_NUM_THREADS=1 reached the ranks
