"""Plugins are found by entry point or dotted path; bad names are one-line errors."""

import pytest

from commbench import registry
from commbench.errors import UsageError
from commbench.optimizers.base import Strategy


class DottedPathPlugin(Strategy):
    name = "dotted"
    summary = "a plugin loaded by module:Class"


class NeedsMissingModule(Strategy):
    name = "needs-missing"
    summary = "x"
    requires = ("a_module_that_does_not_exist_anywhere",)


def test_builtins_are_registered_as_entry_points():
    found = registry.discover()
    assert {"allreduce", "none"} <= set(found)
    assert found["allreduce"].source == "commbench"
    assert registry.resolve("allreduce").name == "allreduce"


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(UsageError) as e:
        registry.resolve("nope")
    assert "unknown strategy 'nope'" in str(e.value) and "allreduce" in str(e.value)


def test_dotted_path_loads_a_plugin_that_is_not_installed():
    assert registry.resolve("test_registry:DottedPathPlugin") is DottedPathPlugin
    with pytest.raises(UsageError, match="cannot be loaded"):
        registry.resolve("test_registry:Missing")
    with pytest.raises(UsageError, match="not a commbench"):
        registry.resolve("test_registry:make_doc_that_is_not_a_class")


make_doc_that_is_not_a_class = object()


def test_missing_requirement_makes_a_plugin_unusable_with_a_reason():
    assert "a_module_that_does_not_exist_anywhere" in NeedsMissingModule.unusable_reason()
    assert DottedPathPlugin.unusable_reason() is None


class FakeEntryPoint:
    def __init__(self, name, value):
        self.name, self.value, self.dist = name, value, None


def test_two_different_plugins_with_one_name_are_an_error(monkeypatch):
    monkeypatch.setattr(registry, "_entry_points", lambda group: [
        FakeEntryPoint("x", "a.b:C"), FakeEntryPoint("x", "d.e:F")])
    with pytest.raises(UsageError, match="two plugins are named 'x'"):
        registry.discover()


def test_the_same_plugin_declared_twice_is_not_an_error(monkeypatch):
    monkeypatch.setattr(registry, "_entry_points", lambda group: [
        FakeEntryPoint("x", "a.b:C"), FakeEntryPoint("x", "a.b:C")])
    assert list(registry.discover()) == ["x"]


def test_a_broken_plugin_is_listed_as_unusable_not_a_crash(monkeypatch):
    monkeypatch.setattr(registry, "_entry_points", lambda group: [
        FakeEntryPoint("broken", "no_such_module_xyz:Plugin"),
        FakeEntryPoint("ok", "test_registry:DottedPathPlugin")])
    rows = {r["name"]: r for r in registry.describe_all()}
    assert not rows["broken"]["usable"] and "cannot be loaded" in rows["broken"]["why_not"]
    assert rows["ok"]["usable"]
