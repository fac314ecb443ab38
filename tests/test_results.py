"""Result files: atomic, unique, schema-versioned; readers skip strangers."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from commbench.result import store
from commbench.errors import UsageError


def make_doc(**extra):
    doc = store.new_document("run")
    doc.update(config={"model": "resnet18"}, summary={"workers": 1}, **extra)
    return doc


def test_written_result_reads_back_with_its_schema(tmp_path):
    path = store.write_result(tmp_path, make_doc(), "resnet18-allreduce-n1")
    assert path.parent == tmp_path and path.name.endswith(".json")
    assert "resnet18-allreduce-n1" in path.name
    doc = json.loads(path.read_text())
    assert doc["format"] == "commbench-result"
    assert doc["schema_version"] == store.SCHEMA_VERSION
    assert store.read_result(path) == doc


def test_never_overwrites_and_leaves_no_temporary_files(tmp_path, monkeypatch):
    first = store.write_result(tmp_path, make_doc(), "x")
    # Force a name collision: the writer must pick another name, not overwrite.
    names = iter([first.name, "second.json"])
    monkeypatch.setattr(store, "result_name", lambda doc, stem: next(names))
    second = store.write_result(tmp_path, make_doc(run=2), "x")
    assert second.name == "second.json"
    assert json.loads(first.read_text()).get("run") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, "second.json"])


def test_failed_write_leaves_nothing_behind(tmp_path):
    with pytest.raises(TypeError):  # not JSON at all (a NaN is written, as "NaN")
        store.write_result(tmp_path, make_doc(bad=object()), "x")
    assert list(tmp_path.iterdir()) == []


def test_unwritable_directory_is_reported_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="--results-dir"):
        store.ensure_writable(blocker / "sub")


@pytest.mark.parametrize("content, reason", [
    (b"", "not valid JSON"),
    (b'{"format": "commbench-result", "sch', "not valid JSON"),
    (b"\xff\xfe garbage", "not valid JSON"),
    (b'{"name": "other tool"}', "not a commbench result"),
    (b"[1, 2, 3]", "not a commbench result"),
    (b'{"format": "commbench-result", "schema_version": 99}', "newer"),
    (b'{"format": "commbench-result", "schema_version": 1, "status": "failed"}',
     "did not complete"),
    (b'{"format": "commbench-result", "schema_version": 1, "status": "ok"}', "missing"),
])
def test_readers_skip_every_kind_of_stranger_with_a_reason(tmp_path, content, reason):
    good = store.write_result(tmp_path, make_doc(), "good")
    (tmp_path / "stranger.json").write_bytes(content)
    found, warnings = store.load_results([tmp_path])
    assert [r.path for r in found] == [good]
    assert len(warnings) == 1 and "stranger.json" in warnings[0] and reason in warnings[0]


def test_loading_accepts_files_and_directories_and_ignores_hidden_partials(tmp_path):
    a = store.write_result(tmp_path, make_doc(), "a")
    (tmp_path / ".partial-123.json").write_text("{")
    sub = tmp_path / "sub"
    sub.mkdir()
    b = store.write_result(sub, make_doc(), "b")
    found, warnings = store.load_results([a, sub])
    assert [r.path for r in found] == [a, b] and warnings == []
    found, _ = store.load_results([tmp_path])
    assert {r.path for r in found} == {a, b}


def test_unreadable_file_is_a_warning(tmp_path):
    path = tmp_path / "secret.json"
    path.write_text("{}")
    os.chmod(path, 0)
    found, warnings = store.load_results([tmp_path])
    if os.access(path, os.R_OK):  # root reads everything; the JSON is still foreign
        assert "not a commbench result" in warnings[0]
    else:
        assert "cannot read" in warnings[0]


def test_the_commit_recorded_is_commbench_s_own_checkout_only(tmp_path):
    from commbench.result import environment

    def repo(top):
        git = ["git", "-C", str(top), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(["git", "init", "-q", str(top)], check=True)
        (top / "file").write_text("x")
        subprocess.run(git + ["add", "file"], check=True)
        subprocess.run(git + ["commit", "-qm", "x"], check=True)
        return subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()

    checkout = tmp_path / "a checkout"  # a space in the path
    (checkout / "commbench").mkdir(parents=True)
    commit = repo(checkout)
    assert environment.git_commit(checkout / "commbench") == commit
    # a wheel installed in a virtual environment inside another project's repository
    other = tmp_path / "other"
    package = other / ".venv" / "lib" / "site-packages" / "commbench"
    package.mkdir(parents=True)
    repo(other)
    assert environment.git_commit(package) is None
    assert environment.git_commit(tmp_path / "nowhere") is None
    assert environment.git_commit() == (subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=Path(environment.__file__).parent,
        capture_output=True, text=True).stdout.strip() or None)  # None outside a checkout
