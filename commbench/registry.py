"""Find `--dist-optimizer` plugins by name.

Built-ins and third-party plugins are found the same way: the entry-point group
`commbench.optimizers` (see pyproject.toml). A `package.module:Class` dotted path
loads a plugin that is not installed, for quick experiments. Plugins' microbench ops
are found the same way, in their own group (commbench.microbench.ops).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

from commbench.errors import UsageError

GROUP = "commbench.optimizers"


@dataclass(frozen=True)
class PluginEntry:
    name: str
    target: str  # "package.module:Class"
    source: str  # distribution that declares it, or "path"

    def load(self) -> Type:
        module_name, _, attr = self.target.partition(":")
        try:
            obj = importlib.import_module(module_name)
            for part in attr.split(".") if attr else ():
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise UsageError(f"plugin {self.name!r} ({self.target}) cannot be loaded: {e}")
        return obj


def _entry_points(group: str):
    eps = metadata.entry_points()
    if hasattr(eps, "select"):  # Python >= 3.10
        return list(eps.select(group=group))
    # Python 3.9: entry points do not know their distribution; walk the
    # distributions instead, so that `commbench list` can name each plugin's source.
    return [SimpleNamespace(name=ep.name, value=ep.value, dist=dist)
            for dist in metadata.distributions() for ep in dist.entry_points
            if ep.group == group]


def discover(group: str = GROUP) -> Dict[str, PluginEntry]:
    """Every installed plugin of the entry-point group by name; two different plugins of
    one name are an error."""
    found: Dict[str, PluginEntry] = {}
    for ep in _entry_points(group):
        dist = getattr(ep, "dist", None)
        entry = PluginEntry(ep.name, ep.value, dist.metadata["Name"] if dist else "?")
        seen = found.get(ep.name)
        if seen and seen.target != entry.target:
            raise UsageError(f"two plugins are named {ep.name!r}: {seen.target} "
                             f"({seen.source}) and {entry.target} ({entry.source})")
        found.setdefault(ep.name, entry)
    return dict(sorted(found.items()))


def resolve(name: str) -> Type:
    """The plugin class for a --dist-optimizer value (a name or module:Class)."""
    if ":" in name:
        cls = PluginEntry(name, name, "path").load()
    else:
        plugins = discover()
        if name not in plugins:
            raise UsageError(f"argument --dist-optimizer: unknown strategy {name!r}; "
                             f"available: {', '.join(plugins) or '(none installed)'}")
        cls = plugins[name].load()
    _check_shape(name, cls)
    return cls


def _check_shape(name: str, cls) -> None:
    from commbench.optimizers.base import Strategy

    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise UsageError(f"plugin {name!r} is not a commbench.optimizers.base.Strategy")


def loadable() -> Dict[str, Type]:
    """Every installed plugin that loads and has the right shape, by name."""
    found = {}
    for entry in discover().values():
        try:
            cls = entry.load()
            _check_shape(entry.name, cls)
        except UsageError:
            continue  # `commbench list` shows why
        found[entry.name] = cls
    return found


def usable_reason(cls) -> Optional[str]:
    try:
        return cls.unusable_reason()
    except Exception as e:  # a broken plugin must not break `commbench list`
        return f"its availability check failed: {e}"


def describe_all() -> List[dict]:
    """Rows for `commbench list`: name, summary, source, usable, why not, its flags, the
    --compression kinds it takes."""
    from commbench.config.flags import flag_fields, option_name

    rows = []
    for entry in discover().values():
        try:
            cls = entry.load()
            _check_shape(entry.name, cls)
            why, summary = usable_reason(cls), cls.summary
            options = [option_name(f.name) for f in flag_fields(cls.Options)]
            sends = [k if k != "powersgd" else "powersgd:RANK" for k in cls.compressions]
        except UsageError as e:
            why, summary, options, sends = str(e), "", [], []
        rows.append({"name": entry.name, "summary": summary, "source": entry.source,
                     "usable": why is None, "why_not": why, "options": options,
                     "compressions": sends})
    return rows


def others_options(cls: Type) -> Dict[str, Tuple[Any, Tuple[str, ...]]]:
    """The flags other installed plugins declare and plugin cls does not: each field's
    name, with its default and the plugins that read it."""
    from dataclasses import fields

    from commbench.config.flags import flag_fields

    own = {f.name for f in fields(cls.Options)}
    found: Dict[str, Tuple[Any, Tuple[str, ...]]] = {}
    for name, plugin in loadable().items():
        for f in flag_fields(plugin.Options):
            if f.name not in own:
                default, readers = found.get(f.name, (f.default, ()))
                found[f.name] = (default, (*readers, name))
    return found


def refuse_unread(names: Sequence[str], config, whose: Optional[str] = None,
                  launch=None) -> None:
    """The one rule for every command: a flag given a value other than its default that
    no plugin named reads changes nothing, and is refused in one line. Without `whose`
    (`commbench run`, one strategy) the line says why that plugin does not read it; with
    it (a sweep's strategies, simulate's, microbench's ops) that none of them does, e.g.
    "strategy of this sweep". Plugins that cannot be loaded do not count: the command
    says why apart."""
    from commbench.config.sections import refuse_unread as refuse

    unread: Dict[str, Dict[str, str]] = {}  # plugin -> what it does not read, and why
    defaults: Dict[str, Any] = {}  # of the plugins' options
    for name in dict.fromkeys(names):
        try:
            cls = resolve(name)
        except UsageError:
            continue
        others = others_options(cls)
        unread[name] = {**cls.unread(config, launch), **{
            flag: f"means nothing to {cls.name}; only {' and '.join(readers)} "
                  f"read{'s' if len(readers) == 1 else ''} it"
            for flag, (_, readers) in others.items()}}
        defaults.update({flag: default for flag, (default, _) in others.items()})
    if whose is None:
        for moot in unread.values():
            refuse(config, moot, defaults)
    elif unread:
        everyone = sorted(set.intersection(*(set(m) for m in unread.values())))
        refuse(config, {flag: f"means nothing to any {whose} ({', '.join(unread)}); leave "
                        "it out" for flag in everyone}, defaults)
