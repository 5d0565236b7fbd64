"""The shipped recipe, checked without a container runtime: the example settings file loads, every SLUICEGATE_
variable the image and the compose file set is a setting, and the image's HEALTHCHECK command says ready only
when /readyz does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluicegate.settings import load
from sluicegate.settings.model import CONFIG_ENV, FIELDS, SECRETS, env_name
from sluicegate.testing.refserver import free_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_the_example_settings_file_loads() -> None:
    s = load({}, DEPLOY / "sluicegate.toml").settings
    assert s.host == "0.0.0.0" and s.keepalive_timeout == 65 and s.log_format == "json"


def test_every_variable_the_recipe_sets_is_a_setting() -> None:
    known = {env_name(n) for n in FIELDS} | {env_name(n) + "_FILE" for n in SECRETS} | {CONFIG_ENV}
    text = (DEPLOY / "Dockerfile").read_text() + (DEPLOY / "compose.yaml").read_text()
    used = set(re.findall(r"\b(SLUICEGATE_[A-Z_]+)", text))
    assert used and used <= known, sorted(used - known)


def _healthcheck() -> list[str]:
    text = (DEPLOY / "Dockerfile").read_text()
    m = re.search(r"^HEALTHCHECK [^\n]*CMD \\\n\s*(\[.*\])$", text, re.M)
    assert m, "no exec-form HEALTHCHECK"
    argv: list[str] = json.loads(m.group(1))
    assert argv[0] == "python"
    return [sys.executable, *argv[1:]]


def test_the_healthcheck_is_ready_only_when_readyz_is(tmp_path: Path) -> None:
    from sluicegate.testing.refserver import running

    argv = _healthcheck()
    closed = subprocess.run(argv, env={"SLUICEGATE_PORT": str(free_port())}, capture_output=True, timeout=60)
    assert closed.returncode == 1
    with running(tmp_path) as server:
        ok = subprocess.run(argv, env={"SLUICEGATE_PORT": str(server.port)}, capture_output=True, timeout=60)
        assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("name", ["compose.yaml", "grafana/provisioning/dashboards/sluicegate.yaml"])
def test_the_yaml_files_parse(name: str) -> None:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((DEPLOY / name).read_text())
    if name == "compose.yaml":
        assert {"postgres", "redis", "migrate", "replica1", "replica2", "replica3", "haproxy"} <= doc["services"].keys()
        assert doc["services"]["replica2"]["environment"]["SLUICEGATE_DATABASE_URL_FILE"] == "/run/secrets/database_url"
