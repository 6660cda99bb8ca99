"""The ``boundedcode-gateway`` command: argument parsing and dispatch to the subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from boundedcode_gateway.config import ConfigSource, GatewayConfig, calls_path_in
from boundedcode_gateway.errors import ConfigError

CONFIG_ENV = "BOUNDEDCODE_GATEWAY_CONFIG"
LOCAL_CONFIG = Path("gateway.yaml")
EXIT_CONFIG = 2


def config_source(path: str | None) -> ConfigSource:
    """``--config``, else $BOUNDEDCODE_GATEWAY_CONFIG, else ./gateway.yaml, else the default
    (chosen once: a reload reads the same one again)."""
    chosen = path or os.environ.get(CONFIG_ENV)
    if chosen:
        return ConfigSource(Path(chosen))
    if LOCAL_CONFIG.is_file():
        return ConfigSource(LOCAL_CONFIG)
    return ConfigSource()


def _parser() -> argparse.ArgumentParser:
    from boundedcode_gateway.cli.serve import DEFAULT_HOST, DEFAULT_PORT

    parser = argparse.ArgumentParser(prog="boundedcode-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML configuration file")
    serve.add_argument("--host", default=DEFAULT_HOST)
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow an address off the loopback interface without auth: (anyone there may call)",
    )
    check = sub.add_parser("check-config", help="validate a configuration file and exit")
    check.add_argument("--config")
    llama = sub.add_parser("llama-server", help="show the llama-server a profile runs")
    llama.add_argument("profile")
    llama.add_argument("--config")
    llama.add_argument(
        "--print", action="store_true", required=True, help="print the command line and environment"
    )
    chat = sub.add_parser("chat", help="chat with a running gateway in the terminal")
    chat.add_argument("--url", default=f"http://{DEFAULT_HOST}:{DEFAULT_PORT}")
    chat.add_argument("--model", default="local")
    chat.add_argument("--history", help="JSON file of earlier messages to start from")
    chat.add_argument(
        "--message",
        action="append",
        help="send this message instead of reading the terminal (repeatable)",
    )
    calls = sub.add_parser("calls", help="print recent calls as a table")
    calls.add_argument("--config")
    calls.add_argument("--task")
    calls.add_argument("--last", type=int, default=20)
    budgets = sub.add_parser("budgets", help="print what each budget has spent and has left")
    budgets.add_argument("--config")
    _report_parser(sub)
    _credential_parsers(sub)
    return parser


def _credential_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    key = sub.add_parser("key", help="caller keys")
    key_sub = key.add_subparsers(dest="key_command", required=True)
    new = key_sub.add_parser(
        "new", help="make a caller key: print it once, with the configuration lines that admit it"
    )
    new.add_argument("--name", required=True, help="what the call log shows for its calls")
    new.add_argument(
        "--models", default="*", help="comma-separated model names it may use (default: all)"
    )
    new.add_argument("--admin", action="store_true")
    token = sub.add_parser("token", help="mint a token for one task (a sandbox's credential)")
    token.add_argument("--task", required=True)
    token.add_argument("--models", required=True, help="comma-separated model names it may use")
    token.add_argument(
        "--ttl",
        required=True,
        help="how long it is valid: 90s, 30m, 2h, 7d (at most auth.max_token_ttl_s)",
    )
    token.add_argument("--budget-tokens", type=int, help="the token budget it carries")
    token.add_argument("--config")
    seal = sub.add_parser(
        "seal-key", help="the key ring that signs thinking blocks and seals reasoning items"
    )
    seal_sub = seal.add_subparsers(dest="seal_command", required=True)
    rotate = seal_sub.add_parser(
        "rotate", help="sign with a new key; older keys verify until a later rotation drops them"
    )
    rotate.add_argument("--config")
    rotate.add_argument(
        "--keep",
        type=int,
        default=2,
        help="keys the ring holds afterwards, the new one counted (default 2: it and the last)",
    )
    listed = seal_sub.add_parser("list", help="print the ids of the ring's keys")
    listed.add_argument("--config")


def _report_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = sub.add_parser(
        "report", help="per-call rows and per-task totals of a call log, and charts"
    )
    source = report.add_mutually_exclusive_group()
    source.add_argument("--config", help="read the call log of this configuration's data_dir")
    source.add_argument("--data-dir", help="read DATA_DIR/calls.jsonl")
    report.add_argument("--task")
    report.add_argument("--purpose")
    report.add_argument("--since", help="calls started at or after this ISO 8601 time (UTC)")
    report.add_argument("--format", choices=("md", "json", "csv"), default="md")
    report.add_argument(
        "--table",
        choices=("calls", "totals"),
        default="calls",
        help="with --format csv: which table (Markdown and JSON hold both)",
    )
    report.add_argument("--plots", metavar="DIR", help="write PNG charts here (needs matplotlib)")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console command."""
    args = _parser().parse_args(argv)
    if args.command == "chat":
        from boundedcode_gateway.cli.chat import KEY_ENV, run_chat

        key = os.environ.get(KEY_ENV)
        return run_chat(args.url, args.model, args.history, args.message, key)
    if args.command == "key":
        from boundedcode_gateway.cli.credentials import model_names, run_key_new

        return run_key_new(args.name, model_names(args.models), args.admin)
    if args.command == "report" and args.data_dir is not None:
        return _report(args, calls_path_in(args.data_dir))
    try:
        source = config_source(args.config)
        config = source.load()
        if args.command == "serve":
            from boundedcode_gateway.cli.serve import run_serve

            return run_serve(config, args.host, args.port, source, args.insecure_no_auth)
        if args.command == "llama-server":
            from boundedcode_gateway.cli.llama_server import run_print

            return run_print(config, args.profile)
        if args.command == "check-config":
            print(f"configuration ok: {len(config.models)} model profile(s)")
            return 0
        if args.command == "report":
            return _report(args, config.calls_path)
        if args.command == "budgets":
            from boundedcode_gateway.cli.budgets import run_budgets

            return run_budgets(config)
        if args.command in ("token", "seal-key"):
            return _keys_and_tokens(args, config)
        from boundedcode_gateway.cli.calls import run_calls

        return run_calls(config.ledger_location, config.calls_path, args.task, args.last)
    except ConfigError as exc:
        print(f"boundedcode-gateway: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def _keys_and_tokens(args: argparse.Namespace, config: GatewayConfig) -> int:
    """``token`` and ``seal-key``: what the gateway's secrets make."""
    if args.command == "token":
        from boundedcode_gateway.cli.credentials import model_names, run_token

        models = model_names(args.models)
        return run_token(config, args.task, models, args.ttl, args.budget_tokens)
    from boundedcode_gateway.cli.seal_keys import run_list, run_rotate

    if args.seal_command == "rotate":
        return run_rotate(config, args.keep)
    return run_list(config)


def _report(args: argparse.Namespace, calls_path: Path) -> int:
    from boundedcode_gateway.cli.report import run_report

    plots = Path(args.plots) if args.plots else None
    return run_report(
        calls_path, args.task, args.purpose, args.since, args.format, args.table, plots
    )


if __name__ == "__main__":
    sys.exit(main())
