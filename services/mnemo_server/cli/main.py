"""`mnemo`: run the server, manage tenants and memories, and maintain the data directory."""

from __future__ import annotations

import logging
import sys

import click

from mnemo_client.client import MnemoError as ClientError
from mnemo_server import __version__
from mnemo_server.cli.bench import bench
from mnemo_server.cli.bench_tenants import bench_tenants
from mnemo_server.cli.evaluate import eval_group
from mnemo_server.cli.offline import reembed, reindex
from mnemo_server.cli.remote import health, key, memory, status, tenant
from mnemo_server.cli.serve import serve, up
from mnemo_server.errors import MnemoError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mnemo")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def cli(verbose: bool) -> None:
    """Mnemo: memory for AI agents over gRPC."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


for command in (
    up,
    serve,
    tenant,
    key,
    memory,
    status,
    health,
    reembed,
    reindex,
    eval_group,
    bench,
    bench_tenants,
):
    cli.add_command(command)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except MnemoError as exc:
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(2)
    except ClientError as exc:  # a call to a server (--server) failed: its status, one line
        click.echo(f"error: {exc.code.name}: {exc.message}", err=True)
        sys.exit(1)
    except OSError as exc:  # the machine's: a full disk, a file gone, a wait that timed out
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
