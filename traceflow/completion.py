"""Shell completion scripts generated from the CLI definition itself.

``completions/`` holds the generated scripts; a test regenerates them and fails when they
drift from the CLI. Regenerate with ``python -m traceflow.completion completions/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

FILES = {"bash": "traceflow.bash", "zsh": "_traceflow", "fish": "traceflow.fish"}


def _choices(param) -> list:
    """Allowed values of an option (an Enum annotation in typer, a Choice type in click)."""
    import enum
    ann = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return [e.value for e in ann]
    return list(getattr(getattr(param, "type", None), "choices", None) or [])


def _commands() -> dict[str, dict]:
    """command name -> {"help": str, "options": [(flags, help, choices)]}, from the CLI."""
    import typer.main
    from traceflow.cli import app
    group = typer.main.get_command(app)
    out = {}
    for name in sorted(group.commands):
        cmd = group.commands[name]
        opts = []
        for p in cmd.params:
            if getattr(p, "param_type_name", "") != "option":
                continue
            choices = _choices(p)
            opts.append((list(p.opts) + list(p.secondary_opts), (p.help or "").split(". ")[0].rstrip("."),
                         [str(c) for c in choices], bool(getattr(p, "is_flag", False))))
        opts.append((["--help", "-h"], "Show help", [], True))
        out[name] = {"help": (cmd.help or "").strip().splitlines()[0], "options": opts}
    return out


def bash() -> str:
    cmds = _commands()
    lines = ["# bash completion for traceflow (generated from the CLI; do not edit)",
             "_traceflow() {",
             "    local cur prev cmd",
             '    cur="${COMP_WORDS[COMP_CWORD]}"',
             '    prev="${COMP_WORDS[COMP_CWORD-1]}"',
             '    cmd="${COMP_WORDS[1]}"',
             "    if [[ ${COMP_CWORD} -eq 1 ]]; then",
             f'        COMPREPLY=($(compgen -W "{" ".join(cmds)} --help --version" -- "$cur"))',
             "        return",
             "    fi",
             '    case "$cmd" in']
    for name, info in cmds.items():
        lines.append(f"        {name})")
        lines.append('            case "$prev" in')
        for flags, _, choices, _ in info["options"]:
            if choices:
                lines.append(f'                {"|".join(flags)}) COMPREPLY=($(compgen -W '
                             f'"{" ".join(choices)}" -- "$cur")); return;;')
            elif "--bundle" in flags:
                lines.append(f'                {"|".join(flags)}) COMPREPLY=($(compgen -f -- "$cur")); return;;')
        lines.append("            esac")
        words = " ".join(f for flags, *_ in info["options"] for f in flags)
        lines.append(f'            COMPREPLY=($(compgen -W "{words}" -- "$cur"));;')
    lines += ["    esac", "}", "complete -o default -F _traceflow traceflow kubectl-traceflow", ""]
    return "\n".join(lines)


def _q(text: str) -> str:
    return text.replace("'", "").replace("[", "(").replace("]", ")").replace(":", " -")


def zsh() -> str:
    cmds = _commands()
    lines = ["#compdef traceflow kubectl-traceflow",
             "# zsh completion for traceflow (generated from the CLI; do not edit)",
             "_traceflow() {",
             "  local -a commands",
             "  commands=("]
    for name, info in cmds.items():
        lines.append(f"    '{name}:{_q(info['help'])}'")
    lines += ["  )",
              "  if (( CURRENT == 2 )); then",
              "    _describe 'command' commands",
              "    return",
              "  fi",
              "  case ${words[2]} in"]
    for name, info in cmds.items():
        lines.append(f"    {name})")
        args = []
        for flags, help_, choices, is_flag in info["options"]:
            for f in flags:
                spec = f"'{f}[{_q(help_)}]"
                if choices:
                    spec += f":value:({' '.join(choices)})"
                elif "--bundle" in flags:
                    spec += ":bundle:_files"
                elif not is_flag:
                    spec += ":value:"
                args.append(spec + "'")
        lines.append("      _arguments " + " ".join(args) + " '*:argument:'")
        lines.append("      ;;")
    lines += ["  esac", "}", '_traceflow "$@"', ""]
    return "\n".join(lines)


def fish() -> str:
    cmds = _commands()
    lines = ["# fish completion for traceflow (generated from the CLI; do not edit)"]
    names = " ".join(cmds)
    for name, info in cmds.items():
        lines.append(f"complete -c traceflow -f -n 'not __fish_seen_subcommand_from {names}' "
                     f"-a {name} -d '{_q(info['help'])}'")
    for name, info in cmds.items():
        for flags, help_, choices, is_flag in info["options"]:
            parts = [f"complete -c traceflow -n '__fish_seen_subcommand_from {name}'"]
            for f in flags:
                parts.append(f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}")
            if choices:
                parts.append(f"-x -a '{' '.join(choices)}'")
            elif "--bundle" in flags:
                parts.append("-r -F")
            elif not is_flag:
                parts.append("-x")
            parts.append(f"-d '{_q(help_)}'")
            lines.append(" ".join(parts))
    return "\n".join(lines) + "\n"


GENERATORS = {"bash": bash, "zsh": zsh, "fish": fish}


def write_all(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for shell, filename in FILES.items():
        (folder / filename).write_text(GENERATORS[shell]())


if __name__ == "__main__":
    write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "completions"))
