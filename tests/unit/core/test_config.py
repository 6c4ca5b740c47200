"""The configuration file (share_core.config): flags mapped onto it, validated with the field named."""

from __future__ import annotations

from pathlib import Path

import pytest

from share_core.config import ConfigError
from share_core.config import configurable
from share_core.config import field_name
from share_core.config import parse_args
from share_core.config import read_config
from share_core.config import section_defaults
from share_dra.cli import build_parser as dra_parser
from share_plugin.cli import build_parser as plugin_parser
from share_scheduler.cli import build_parser as scheduler_parser


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


HEAD = "apiVersion: gpushare.io/v1\nkind: Configuration\n"


def test_field_names_are_the_long_flags_in_camel_case() -> None:
    assert field_name("--filter-keeps") == "filterKeeps"
    assert field_name("--policy") == "policy"
    fields = configurable(plugin_parser())
    assert {"deviceListStrategy", "monitorInterval", "healthCheck", "mps", "backend", "simGpus"} <= set(fields)
    assert "config" not in fields and "help" not in fields and "noHealthCheck" not in fields


def test_the_file_sets_what_flags_do_not(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "scheduler:\n  policy: frag\n  filterKeeps: fitting\n  threads: 4\n  assumeTtl: 60\n")
    args = parse_args(scheduler_parser(), ["--config", path])
    assert (args.policy, args.filter_keeps, args.threads, args.assume_ttl) == ("frag", "fitting", 4, 60.0)
    # a flag wins over the file, before or after the serve command
    args = parse_args(scheduler_parser(), ["--config", path, "--policy", "binpack"])
    assert (args.policy, args.threads) == ("binpack", 4)
    args = parse_args(scheduler_parser(), ["serve", "--config", path, "--threads", "8"])
    assert (args.policy, args.threads) == ("frag", 8)


def test_switches_take_booleans_both_ways(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "plugin:\n  healthCheck: false\n  mps: true\ndra:\n  healthCheck: false\n")
    args = parse_args(plugin_parser(), ["--config", path])
    assert (args.health_check, args.mps) == (False, True)
    assert parse_args(plugin_parser(), ["--config", path, "--health-check"]).health_check is True
    assert parse_args(dra_parser(), ["--config", path]).health_check is False


def test_a_program_reads_only_its_own_section(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "scheduler:\n  policy: frag\nplugin:\n  backend: sim\n")
    assert parse_args(dra_parser(), ["--config", path]).backend == "nvml"
    assert parse_args(plugin_parser(), ["--config", path]).backend == "sim"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("scheduler:\n  polcy: frag\n", "scheduler.polcy: unknown field (known: "),
        ("scheduler:\n  policy: fragile\n", "scheduler.policy: 'fragile' is not one of "),
        ("scheduler:\n  threads: '4'\n", "scheduler.threads: '4' is not a whole number"),
        ("scheduler:\n  threads: true\n", "scheduler.threads: True is not a whole number"),
        ("scheduler:\n  assumeTtl: soon\n", "scheduler.assumeTtl: 'soon' is not a number"),
        ("schedular:\n  policy: frag\n", "schedular: unknown field (known: apiVersion, kind, scheduler"),
        ("scheduler: frag\n", "scheduler: must be a mapping of settings"),
    ],
)
def test_mistakes_are_refused_naming_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, HEAD + text)
    with pytest.raises(ConfigError) as err:
        section_defaults(scheduler_parser(), read_config(path), path)
    assert message in str(err.value) and str(err.value).startswith(path)


def test_switch_given_a_string_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "plugin:\n  mps: 'yes'\n")
    with pytest.raises(ConfigError, match=r"plugin\.mps: 'yes' is not a boolean"):
        section_defaults(plugin_parser(), read_config(path), path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("apiVersion: gpushare.io/v2\nkind: Configuration\n", "apiVersion: 'gpushare.io/v2' is not supported"),
        ("kind: Configuration\n", "apiVersion: None is not supported"),
        ("apiVersion: gpushare.io/v1\nkind: Config\n", "kind: 'Config' must be 'Configuration'"),
        ("- a\n- b\n", "must be a mapping, not list"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_the_document_itself_is_checked(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        read_config(write(tmp_path, text))


def test_a_bad_file_exits_2_like_a_bad_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, HEAD + "plugin:\n  deviceListStrategy: mounts\n")
    with pytest.raises(SystemExit) as exit_:
        parse_args(plugin_parser(), ["--config", path])
    assert exit_.value.code == 2
    assert "plugin.deviceListStrategy: 'mounts' is not one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(plugin_parser(), ["--config", str(tmp_path / "missing.yaml")])
    assert "cannot read the configuration file" in capsys.readouterr().err


def test_the_field_reference_in_the_docs_is_current() -> None:
    from hack.config_reference import DOC
    from hack.config_reference import render

    doc = DOC.read_text()
    assert render(doc) == doc, "docs/configuration.md is stale: python -m hack.config_reference --write"
    for section in ("scheduler", "plugin", "dra"):
        assert f"### `{section}`" in doc
