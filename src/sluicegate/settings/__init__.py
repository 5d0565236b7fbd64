"""One typed settings model for `serve` and the commands that share its store: flags, `SLUICEGATE_*`
environment, a TOML file, defaults (settings/model.py), becoming the frozen `Config` (settings/convert.py)."""

from sluicegate.settings.convert import to_config
from sluicegate.settings.model import ENV_PREFIX, FIELDS, Loaded, ServeSettings, SettingsError, load
from sluicegate.settings.show import redact, render

__all__ = ["ENV_PREFIX", "FIELDS", "Loaded", "ServeSettings", "SettingsError", "load", "redact", "render",
           "to_config"]
