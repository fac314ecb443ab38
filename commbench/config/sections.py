"""Configuration owned by its component. Each part of a run (the model, the data, a speed
run, training to accuracy, the recipe, the straggler, the topology, ...) declares its
flags in its own module as a section: a frozen dataclass of commbench.config.flags.flag
fields, titled for `--help`. commbench.config.run_config.RunConfig is the union of the
sections, so that a component reads its values where every other reads them
(`config.topology`) and a result records every flag by its name.

A flag nothing in the run reads is refused by one rule, `refuse_unread`: a section says
which of its flags the run's other values make moot (`unread`), and a strategy says
which strategy sections it reads (optimizers/base.py: `Strategy.sections`); the flags
of every other strategy section are moot for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Mapping, Tuple

from commbench.config.flags import flag_fields, option_name
from commbench.errors import UsageError


@dataclass(frozen=True)
class Section:
    """A component's own flags (fields declared with commbench.config.flags.flag)."""

    title: ClassVar[str] = ""  # its group in --help
    # For a strategy section: why a strategy that does not read it ignores its flags.
    ignored_because: ClassVar[str] = ""

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        """The names of this section's flags."""
        return tuple(f.name for f in flag_fields(cls))

    @classmethod
    def unread(cls, config: Any) -> Dict[str, str]:
        """This section's flags that the run's other values make moot, each with why (as
        said after "argument --flag: "). config is the whole RunConfig."""
        return {}


def given(config: Any, name: str, default: Any = dataclasses.MISSING) -> bool:
    """Whether a flag holds a value other than its default: all argparse leaves to tell a
    flag the user gave from one left alone. A plugin's option (in config.options) needs
    its default passed."""
    if default is dataclasses.MISSING:
        return getattr(config, name) != config.__dataclass_fields__[name].default
    return config.options.get(name, default) != default


def refuse_unread(config: Any, unread: Mapping[str, str],
                  defaults: Mapping[str, Any] = {}) -> None:
    """Raise UsageError, in one line, for the first flag given a value that nothing in
    the run reads: unread maps each moot flag to why; defaults holds the plugins' options'."""
    for name, why in unread.items():
        if given(config, name, defaults.get(name, dataclasses.MISSING)):
            raise UsageError(f"argument {option_name(name)}: {why}")


