"""Checks made before a sweep command runs anything, each failure one line, no traceback:
the database (reached and migrated: `database_error`), then Ray (`ray_address_error`: an
address that nothing answers is refused in seconds, not after Ray's minutes of retries); and
the exit codes the commands return.
"""

from __future__ import annotations

import socket

from service.db.engine import upgrade_database
from service.db.errors import clean_error, is_transient

from service.core.exit_codes import (  # noqa: F401 - the commands import them from here too
    EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_TRIALS_FAILED)
"""Every trial succeeded or was skipped; a trial failed (or the database or Ray cannot be
reached); bad input (nothing was run); Ctrl-C."""


def database_error(url: str) -> tuple[int, str] | None:
    """None when the database at `url` answers and is migrated (this migrates it), else (exit
    code, one-line reason): 2 for a URL that names no database SQLAlchemy knows, 1 for one
    that cannot be reached. Failing fast here, before Ray: a nightly run must not wait."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return EXIT_BAD_INPUT, (f"{url!r} is not a database URL (e.g. sqlite:///gdn_sweep.db, "
                                f"postgresql://user@host:5432/db)")
    try:
        upgrade_database(url)
    except NoSuchModuleError as err:
        return EXIT_BAD_INPUT, f"database {shown}: {first_line(str(err))}"
    except Exception as err:  # noqa: BLE001 - one line, whatever the driver raised
        what = "cannot reach the database" if is_transient(err) else "database error:"
        return EXIT_TRIALS_FAILED, f"{what} {shown}: {first_line(clean_error(err))}"
    return None


RAY_CONNECT_CHECK_S = 5.0
"""How long the address of a Ray cluster may take to accept a connection."""


def ray_address_error(address: str, *, timeout_s: float = RAY_CONNECT_CHECK_S) -> str | None:
    """None when something listens at the Ray `address` (or it is empty: a local Ray is
    started), else why not, in one line. `auto` finds the cluster this machine is part of, as
    `ray.init` does. Asked before ray.init, which retries an address nothing answers for
    minutes."""
    if not address:
        return None
    if address.startswith(("http://", "https://")):
        return (f"{address} is a dashboard address (what `ray job submit` takes); the sweep "
                f"connects to the cluster itself: HEAD:6379, ray://HEAD:10001 or auto")
    target = address.removeprefix("ray://")
    if address == "auto":
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
        from ray._private.services import canonicalize_bootstrap_address

        # as ray.init("auto") does: a token on this machine turns token auth on (a `ray up`
        # head has ~/.ray/auth_token but no RAY_AUTH_MODE in a `ray submit` shell)
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        try:
            target = canonicalize_bootstrap_address("auto")
        except Exception as err:  # noqa: BLE001 - Ray's reason, in one line
            return f"no Ray cluster found on this machine (address auto): {first_line(str(err))}"
        if target is None:
            return ("no Ray cluster found on this machine (address auto): start one with "
                    "`ray start --head` or `ray up`, or give --address / $RAY_ADDRESS")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return f"{address!r} is not a Ray address (HOST:PORT, ray://HOST:PORT or auto)"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        return f"nothing answers at {target} ({err.strerror or type(err).__name__})"
    if address.startswith("ray://"):
        return None  # a Ray Client server, not the GCS: ray.init says what is wrong
    return _gcs_error(target, timeout_s)


def _gcs_error(target: str, timeout_s: float) -> str | None:
    """Ask the GCS at `target` one question: a token it refuses is said at once here, where
    ray.init would retry for ten minutes."""
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=target).internal_kv_get(b"gdn-sweep", None, timeout=timeout_s)
    except AuthenticationError as err:
        said = str(err).split(". ")[0]
        return (f"the Ray cluster at {target} refused this process's token ({said}): set "
                f"RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<the cluster's token> (or "
                f"RAY_AUTH_TOKEN_PATH=<file>; `ray get-auth-token` on the head prints it)")
    except Exception as err:  # noqa: BLE001 - one line, whatever Ray raised
        return f"the Ray cluster at {target} does not answer: {first_line(str(err))}"
    return None


def first_line(text: str | None) -> str:
    """The first non-blank line of `text` (errors are shown in one line)."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[0] if lines else ""
