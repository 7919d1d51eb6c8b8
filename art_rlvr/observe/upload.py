"""`python -m art_rlvr.observe.upload entity/project`: send the Weave traces recorded offline
(`weave_offline=true`) to W&B, with the key in WANDB_API_KEY (or ~/.netrc). Exit code 2 with
one line when there is no key or nothing to send; records that fail stay on disk for a rerun."""

from __future__ import annotations

import argparse
import os
import sys

from art_rlvr.observe.offline import offline_log_dir, pending_records, upload

DEFAULT_TRACE_SERVER = "https://trace.wandb.ai"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m art_rlvr.observe.upload",
        description="Upload the Weave traces a run recorded offline (weave_offline=true).",
    )
    parser.add_argument("project", help="the run's weave_project, entity/project")
    parser.add_argument(
        "--trace-server-url",
        default=os.environ.get("WF_TRACE_SERVER_URL", DEFAULT_TRACE_SERVER),
        help=f"default: $WF_TRACE_SERVER_URL, else {DEFAULT_TRACE_SERVER}",
    )
    args = parser.parse_args(argv)
    if args.project.count("/") != 1:
        print("error: give the project as entity/project", file=sys.stderr)
        return 2
    from weave.trace import env

    key = env.weave_wandb_api_key()
    if not key:
        print("error: no W&B key: set WANDB_API_KEY (or log in with ~/.netrc)", file=sys.stderr)
        return 2
    folder = offline_log_dir(args.project)
    if not pending_records(folder):
        print(f"error: no offline traces of {args.project} in {folder}", file=sys.stderr)
        return 2
    sent, left = upload(args.project, trace_server_url=args.trace_server_url, api_key=key)
    print(f"sent {sent} record(s) of {args.project} to {args.trace_server_url}")
    if left:
        print(f"error: {left} record(s) could not be sent; they stay in {folder}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
