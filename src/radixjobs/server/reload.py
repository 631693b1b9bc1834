"""SIGHUP for ``radixjobs serve``: read the configuration again and apply what can change live.

Invariants:
- The settings are resolved again exactly as at start (the same arguments, the config file read anew, the same
  environment), so a flag added to ``serve`` later is covered without edits here.
- Nothing is applied from a configuration with a problem: the error is logged in one line and the daemon goes
  on as it was.
- Applied live: ``poll``, ``discovery-interval``, ``grace`` and the CSP services (``service`` and the
  ``radixjobs.services`` entry points, looked up again). Running attempts and service calls are never touched:
  a call started before the reload finishes with the service it started with.
- A configuration file that holds a secret is refused when every user may read it (a reload that fails) and
  warned about on every reload when its group may (radixjobs.config_exposure); the warning names keys, never
  values.
- Every other changed key is logged as "needs restart" (keys only: values, a DSN's password for one, are not
  logged) and keeps its running value, so the next reload says so again until a restart.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import click

from radixjobs.config_file import ConfigFileCommand, key_of
from radixjobs.documents.services import ServiceRegistry, spec_of
from radixjobs.server.daemon import Daemon

log = logging.getLogger("radixjobs.server")

LIVE = frozenset({"poll", "discovery_interval", "grace", "services"})


def parse_services(specs: Iterable[str]) -> dict[str, str]:
    """``NAME=module:function`` pairs; click.BadParameter naming the bad one."""
    allowed: dict[str, str] = {}
    for spec in specs:
        name, sep, target = spec.partition("=")
        if not sep or not name or ":" not in target:
            raise click.BadParameter(f"expected NAME=module:function, got {spec!r}", param_hint="--service")
        try:
            allowed[name] = spec_of(target)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--service") from None
    return allowed


def apply_live(daemon: Daemon, params: dict[str, Any], before: set[str]) -> tuple[set[str], list[str]]:
    """Apply the live settings to the daemon and its owners; returns the service names and their changes
    since ``before``, described."""
    config = daemon.config
    config.poll_s, config.discovery_s, config.grace_s = params["poll"], params["discovery_interval"], params["grace"]
    importlib.invalidate_caches()  # packages installed since the start (entry points)
    config.services = parse_services(params["services"])
    registry = ServiceRegistry(config.services)
    for owner, _ in daemon.owners.values():
        owner.poll_s, owner.grace_s = config.poll_s, config.grace_s
        owner.services = dict(config.services)
        if owner.documents is not None:
            owner.documents.registry = registry
        owner.wake.set()  # a new --poll takes effect now, not after the current sleep
    after = set(registry.names())
    changes = []
    if after - before:
        changes.append("added " + ", ".join(sorted(after - before)))
    if before - after:
        changes.append("removed " + ", ".join(sorted(before - after)))
    return after, changes


def log_config_warning(warning: str | None) -> None:
    """The configuration file's warning (secrets its group may read), at start and on every reload."""
    if warning is not None:
        log.warning("%s", warning, extra={"fields": {"event": "config_file_exposed"}})


def serve_reloader(ctx: click.Context, daemon: Daemon) -> Callable[[], Coroutine[Any, Any, None]]:
    """The daemon's SIGHUP action for the ``serve`` command of ``ctx``."""
    command = ctx.command
    assert isinstance(command, ConfigFileCommand)
    current = dict(ctx.params)
    names = set(ServiceRegistry(daemon.config.services).names())
    keys = {param.name: key_of(param) or param.name for param in command.params if param.name}

    async def reload() -> None:
        try:
            fresh, warning = command.reparse(ctx)
            parse_services(fresh.get("services", ()))
        except click.ClickException as exc:
            log.error("reload failed, the configuration is unchanged: %s", exc.format_message(),
                      extra={"fields": {"event": "reload_failed"}})
            return
        log_config_warning(warning)
        changed = sorted(name for name in fresh if fresh[name] != current.get(name))
        applied = [name for name in changed if name in LIVE]
        restart = [name for name in changed if name not in LIVE]
        current.update({name: fresh[name] for name in applied})
        nonlocal names
        names, services = apply_live(daemon, current, names)
        log.info("reloaded: changed %s; needs restart: %s; CSP services: %s",
                 ", ".join(keys[n] for n in applied) or "nothing",
                 ", ".join(keys[n] for n in restart) or "nothing", "; ".join(services) or "unchanged",
                 extra={"fields": {"event": "reloaded", "applied": [keys[n] for n in applied],
                                   "needs_restart": [keys[n] for n in restart], "services": services}})

    return reload
