"""Pure renderers over a `Report`: the Aliyun-style summary and details tables, JSON and YAML.

Each returns the whole text; the CLI decides where it goes. Colour and bars are opt-in through `Style`
(the CLI turns them on for a terminal only), so the plain output is stable for scripts and golden tests.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import yaml

from share_inspect.report import MODE_DRA
from share_inspect.report import STATE_ALLOCATING
from share_inspect.report import STATE_UNUSED
from share_inspect.report import GpuRow
from share_inspect.report import NodeRow
from share_inspect.report import Report
from share_inspect.report import percent
from share_inspect.report import report_to_dict

RULE = "-" * 80
CLUSTER_LINE = "Allocated/Total GPU Memory In Cluster:"
UNHEALTHY_MARK = "!"

_RESET = "\x1b[0m"
_RED = "\x1b[31m"
_YELLOW = "\x1b[33m"
_GREEN = "\x1b[32m"
_BOLD = "\x1b[1m"


@dataclass(frozen=True, slots=True)
class Style:
    """How fancy the text may be: ANSI colour, and a bar of `bar_width` cells per GPU (0: none)."""

    color: bool = False
    bar_width: int = 0

    def paint(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self.color and code and text else text


PLAIN = Style()

# A cell is its visible text and an ANSI code applied after padding, so columns line up in colour too.
Cell = tuple[str, str]


def _pct(used: int, total: int) -> int:
    """Whole percent, rounded down like the Aliyun tool: 99.9% full is not shown as 100%."""
    return int(percent(used, total))


def _level(used: int, total: int, healthy: bool = True) -> str:
    if not healthy or used > total:
        return _RED
    if total and used * 100 >= total * 90:
        return _YELLOW
    return _GREEN if used else ""


def _bar(used: int, total: int, width: int) -> str:
    filled = min(width, -(-used * width // total)) if total and used else 0
    return "\u2588" * filled + "\u2591" * (width - filled)


def _table(header: Sequence[str], rows: Sequence[Sequence[Cell]], style: Style) -> list[str]:
    """Left-aligned columns two spaces apart; no trailing blanks."""
    widths = [len(h) for h in header]
    for row in rows:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], len(text))
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for row in rows:
        last = len(row) - 1
        parts = []
        for i, (text, code) in enumerate(row):
            pad = "" if i == last else " " * (widths[i] - len(text))
            parts.append(style.paint(text, code) + pad)
        lines.append("  ".join(parts).rstrip())
    return lines


def _gpu_cell(g: GpuRow | None, style: Style) -> Cell:
    if g is None:
        return ("-", "")
    text = f"{g.allocated}/{g.total}"
    if not g.healthy:
        text += UNHEALTHY_MARK
    if style.bar_width:
        text += " " + _bar(g.allocated, g.total, style.bar_width)
    return (text, _level(g.allocated, g.total, g.healthy))


def _cluster_lines(report: Report) -> list[str]:
    return [RULE, CLUSTER_LINE, f"{report.allocated}/{report.total} ({_pct(report.allocated, report.total)}%)"]


def _legend(report: Report) -> list[str]:
    lines = []
    if any(not g.healthy for n in report.nodes for g in n.gpus):
        lines.append(f"{UNHEALTHY_MARK} unhealthy GPU: no new pods are placed on it")
    held = sum(n.held_total for n in report.nodes)
    if held:
        unit = report.unit.value
        lines.append(f"Held for pods not bound yet: {held} {unit} (free to the holders only; see -d)")
    return lines


def _used(mib: int | None, unit: str) -> str:
    """A measured figure in the report's unit: GiB with one decimal (usage is not whole units), or MiB."""
    if mib is None:
        return "-"
    return f"{mib / 1024:.1f}" if unit == "GiB" else str(mib)


def render_summary(report: Report, style: Style = PLAIN) -> str:
    """One row per node, one column per GPU index, PENDING only when some pod waits for a GPU."""
    indices = report.gpu_indices
    show_pending = report.pending > 0
    header = [
        "NAME",
        "IPADDRESS",
        *(["MODE"] if report.has_dra else []),
        *(f"GPU{i}(Allocated/Total)" for i in indices),
    ]
    if show_pending:
        header.append("PENDING(Allocated)")
    header.append(f"GPU Memory({report.unit.value})")
    if report.measured:
        header.append(f"Used({report.unit.value})")
    rows: list[list[Cell]] = []
    for n in report.nodes:
        by_index = {g.index: g for g in n.gpus}
        row: list[Cell] = [(n.name, _BOLD), (n.address or "-", "")]
        if report.has_dra:
            row.append((n.mode, ""))
        row.extend(_gpu_cell(by_index.get(i), style) for i in indices)
        if show_pending:
            row.append((str(n.pending) if n.pending else "0", _YELLOW if n.pending else ""))
        row.append((f"{n.allocated}/{n.total}", _level(n.allocated, n.total)))
        if report.measured:
            row.append((_used(n.used_mib, report.unit.value), ""))
        rows.append(row)
    lines = _table(header, rows, style)
    lines.extend(_legend(report))
    lines.extend(_cluster_lines(report))
    return "\n".join(lines) + "\n"


def _gpu_line(g: GpuRow, unit: str, style: Style) -> str:
    health = "" if g.healthy else "  " + style.paint("UNHEALTHY", _RED)
    bar = f"  {_bar(g.allocated, g.total, style.bar_width)}" if style.bar_width else ""
    model = g.model or "unknown model"
    used = "" if g.used_mib is None else f"  used {_used(g.used_mib, unit)} {unit}"
    return f"GPU{g.index}:  {model}  {g.uuid}  {g.allocated}/{g.total} {unit}{used}{bar}{health}"


def _node_details(n: NodeRow, unit: str, style: Style) -> list[str]:
    lines = [f"NAME:       {style.paint(n.name, _BOLD)}", f"IPADDRESS:  {n.address or '-'}"]
    dra = n.mode == MODE_DRA
    if dra:
        lines.append(f"MODE:       {n.mode} (ResourceSlices of driver gpushare.io, allocated ResourceClaims)")
    lines.extend(_gpu_line(g, unit, style) for g in n.gpus)
    lines.append("")
    indices = [g.index for g in n.gpus]
    show_pending = n.pending > 0
    header = ["NAME", "NAMESPACE", *(["CLAIM"] if dra else []), *(f"GPU{i}(Allocated)" for i in indices)]
    if show_pending:
        header.append("PENDING(Allocated)")
    measured = n.usage_time is not None
    if measured:
        header.append(f"USED({unit})")
    rows: list[list[Cell]] = []
    for p in n.pods:
        name = p.name if p.state not in (STATE_ALLOCATING, STATE_UNUSED) else f"{p.name} ({p.state})"
        row: list[Cell] = [(name, ""), (p.namespace, "")]
        if dra:
            row.append((p.claim or "-", ""))
        row.extend((str(p.gpus.get(i, 0)), "") for i in indices)
        if show_pending:
            row.append((str(p.pending), _YELLOW if p.pending else ""))
        if measured:
            row.append((_used(p.used_total_mib, unit), ""))
        rows.append(row)
    allocated: list[Cell] = [("Allocated:", ""), ("", ""), *([("", "")] if dra else [])]
    total: list[Cell] = [("Total:", ""), ("", ""), *([("", "")] if dra else [])]
    for g in n.gpus:
        allocated.append((f"{g.allocated} ({_pct(g.allocated, g.total)}%)", _level(g.allocated, g.total, g.healthy)))
        total.append((str(g.total) + ("" if g.healthy else UNHEALTHY_MARK), ""))
    if show_pending:
        allocated.append((str(n.pending), _YELLOW))
        total.append(("", ""))
    if measured:
        allocated.append((_used(n.used_mib, unit), ""))
        total.append(("", ""))
    rows.extend([allocated, total])
    if measured:
        used: list[Cell] = [("Used:", ""), ("", ""), *([("", "")] if dra else [])]
        used.extend((_used(g.used_mib, unit), "") for g in n.gpus)
        used.extend([("", "")] * (len(header) - len(used)))
        rows.append(used)
    lines.extend(_table(header, rows, style))
    lines.append(f"Node GPU Memory({unit}):  {n.allocated}/{n.total} ({_pct(n.allocated, n.total)}%)")
    if measured:
        lines.append(f"Node GPU Memory Used({unit}):  {_used(n.used_mib, unit)} (measured {n.usage_time})")
    if n.hard_limit is not None:
        color = "" if n.hard_limit.enforced else _YELLOW
        lines.append(f"Hard GPU Memory Limit:  {style.paint(n.hard_limit.text, color)}")
    for h in n.held:
        gpus = ",".join(str(i) for i in h.gpus)
        what = f"{h.per_gpu} {unit} on GPU {gpus}"
        lines.append(f"Held({h.kind}):  {style.paint(what, _YELLOW)} for {h.holder}, {h.expires_in}s left")
    return lines


def render_details(report: Report, style: Style = PLAIN) -> str:
    """Per node: its GPUs, each pod with its namespace and memory on each GPU, and the node's totals."""
    lines: list[str] = []
    for n in report.nodes:
        lines.extend(_node_details(n, report.unit.value, style))
        lines.append(RULE)
    lines.extend(_legend(report))
    lines.extend(_cluster_lines(report)[1:])
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    return orjson.dumps(report_to_dict(report), option=orjson.OPT_INDENT_2).decode() + "\n"


_PLAIN = re.compile(r"[A-Za-z0-9_./()][A-Za-z0-9_./() :-]*")
_STR_TAG = "tag:yaml.org,2002:str"
_resolver = yaml.resolver.Resolver()


def _yaml_scalar(value: object) -> str:
    """A block-style YAML scalar; strings stay plain only where a YAML 1.1 reader gets the same string back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return _yaml_str(str(value))


@functools.lru_cache(maxsize=8192)  # keys, models, namespaces repeat thousands of times
def _yaml_str(text: str) -> str:
    if (
        _PLAIN.fullmatch(text)
        and not text.endswith((" ", ":"))
        and ": " not in text
        and _resolver.resolve(yaml.ScalarNode, text, (True, False)) == _STR_TAG
    ):
        return text
    return orjson.dumps(text).decode()  # a JSON string is a valid YAML double-quoted scalar


def _yaml_lines(value: object, indent: str, out: list[str]) -> None:
    """Block YAML like `yaml.safe_dump(sort_keys=False)`; PyYAML's own emitter takes ~15 s at 50,000 pods."""
    if isinstance(value, dict):
        for key, item in value.items():
            head = f"{indent}{_yaml_scalar(key)}:"
            if isinstance(item, dict) and item:
                out.append(head)
                _yaml_lines(item, indent + "  ", out)
            elif isinstance(item, list) and item:
                out.append(head)
                _yaml_lines(item, indent, out)
            else:
                out.append(f"{head} {_yaml_flow_empty(item)}")
        return
    assert isinstance(value, list)
    for item in value:
        if isinstance(item, dict) and item:
            start = len(out)
            _yaml_lines(item, indent + "  ", out)
            out[start] = f"{indent}- {out[start][len(indent) + 2 :]}"
        elif isinstance(item, list) and item:
            out.append(f"{indent}-")
            _yaml_lines(item, indent + "  ", out)
        else:
            out.append(f"{indent}- {_yaml_flow_empty(item)}")


def _yaml_flow_empty(value: object) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _yaml_scalar(value)


def render_yaml(report: Report) -> str:
    lines: list[str] = []
    _yaml_lines(report_to_dict(report), "", lines)
    return "\n".join(lines) + "\n"


def render_problems(report: Report, limit: int = 20) -> str:
    """Warnings for stderr: annotations we could not honour, so the numbers can be trusted or questioned."""
    problems = report.problems
    if not problems:
        return ""
    lines = [f"warning: {p}" for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"warning: ... and {len(problems) - limit} more")
    return "\n".join(lines) + "\n"
