"""The MLflow model registry as spanmill uses it: versions with lineage, and two aliases.

``champion`` names the version in service, ``challenger`` the version the gate
let through and the rollout controller is trying. Everything else (which
versions Triton holds, what share of traffic each gets) follows from those two
aliases; moving ``champion`` in the MLflow UI is a promotion like any other.

Every call goes through an explicit :class:`mlflow.MlflowClient`, never MLflow's
global state, so a process can talk to several tracking servers.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from spanmill.contracts import EvalReport
from spanmill.registry import names
from spanmill.registry.lineage import Lineage, learned_from, lineage_from_outputs
from spanmill.registry.names import RegistryError

log = logging.getLogger(__name__)

EXPERIMENT = "spanmill-registry"
# Written last when a trained version is registered (see register_trained).
_VERDICT_TAGS = frozenset({names.TAG_GATE, names.TAG_GATE_REASONS})
_CHALLENGER_EVENT = "challenger: the gate passed"
# Name of the file a version without weights (base, echo) keeps as its artifact:
# MLflow needs a source for every version.
DESCRIPTOR = "spanmill-model.json"
_HISTORY_KEEP = 20
T = TypeVar("T")


@dataclass(frozen=True)
class RegisteredVersion:
    """One version of an agent's registered model."""

    agent: str
    version: int
    source: str
    run_id: str | None
    tags: Mapping[str, str]
    aliases: tuple[str, ...] = ()
    created_at: float = 0.0
    description: str = ""

    @property
    def lineage(self) -> Lineage:
        return Lineage.from_tags(self.tags)

    @property
    def rollout_status(self) -> str | None:
        return self.tags.get(names.TAG_ROLLOUT_STATUS)

    @property
    def rolled_back(self) -> bool:
        return self.rollout_status == names.ROLLED_BACK

    @property
    def registration_pending(self) -> bool:
        """Registering it stopped part-way: see :data:`names.TAG_REGISTRATION`."""
        return self.tags.get(names.TAG_REGISTRATION) == names.REGISTRATION_PENDING

    def events(self) -> list[str]:
        """The rollout decisions recorded on this version, oldest first."""
        keys = sorted(k for k in self.tags if k.startswith(names.ROLLOUT_EVENT_PREFIX))
        return [self.tags[k] for k in keys]


@dataclass(frozen=True)
class Registration:
    version: RegisteredVersion
    challenger: bool  # the alias moved to it


@dataclass(frozen=True)
class Desired:
    """What the aliases ask to serve."""

    champion: int | None
    challenger: int | None
    versions: dict[int, RegisteredVersion] = field(default_factory=dict)


def _measured(evaluation: EvalReport | None) -> tuple[int | None] | None:
    """The champion version an evaluation measured, as a 1-tuple (its version may be None:
    the base model); None where the report does not say (made before it did)."""
    champion = evaluation.models.get("champion", {}) if evaluation is not None else {}
    if "version" not in champion:
        return None
    version = champion["version"]
    return (int(version) if version is not None else None,)


class ModelRegistry:
    """Register versions, read and move aliases, and record what happened to a version."""

    def __init__(self, tracking_uri: str, *, experiment: str = EXPERIMENT) -> None:
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    # -- errors ----------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        from mlflow.exceptions import MlflowException

        try:
            return fn()
        except MlflowException as exc:
            raise RegistryError(
                f"MLflow at {self.tracking_uri}: {what} failed: {exc.message}"
            ) from None
        except OSError as exc:
            raise RegistryError(
                f"cannot reach MLflow at {self.tracking_uri} ({what}): {exc}; start it "
                "(spanmill up) or set SPANMILL_MLFLOW_TRACKING_URI"
            ) from None

    def _missing(self, exc: Exception) -> bool:
        from mlflow.exceptions import MlflowException

        return isinstance(exc, MlflowException) and exc.error_code in (
            "RESOURCE_DOES_NOT_EXIST",
            "NOT_FOUND",
        )

    # -- registered models -------------------------------------------------------------

    def agents(self) -> list[str]:
        """Agents with a registered model that spanmill manages, by name."""
        found = self._call(
            "listing registered models",
            lambda: list(_pages(lambda token: self.client.search_registered_models(
                filter_string=f"tags.`{names.TAG_AGENT}` LIKE '%'", page_token=token
            ))),
        )  # fmt: skip
        return sorted(m.tags.get(names.TAG_AGENT, m.name) for m in found)

    def ensure_model(self, agent: str) -> None:
        """Create the agent's registered model when it does not exist yet."""
        from mlflow.exceptions import MlflowException

        name = names.registered_model(agent)
        try:
            self.client.get_registered_model(name)
            return
        except MlflowException as exc:
            if not self._missing(exc):
                raise RegistryError(f"MLflow at {self.tracking_uri}: {exc.message}") from None
        except OSError as exc:
            raise RegistryError(f"cannot reach MLflow at {self.tracking_uri}: {exc}") from None
        self._call(
            f"creating registered model {name!r}",
            lambda: self.client.create_registered_model(
                name,
                tags={names.TAG_AGENT: agent},
                description=f"Versions of the {agent} agent's model, trained by spanmill.",
            ),
        )

    # -- registering -------------------------------------------------------------------

    def register(
        self,
        agent: str,
        lineage: Lineage,
        model_dir: Path | None = None,
        *,
        run_id: str | None = None,
        artifact_path: str = "model",
        description: str = "",
    ) -> RegisteredVersion:
        """Register a new version of the agent's model and return it.

        ``model_dir`` (an adapter or model folder) is logged as the version's
        artifacts, to the run ``run_id`` when given, else to a new run of the
        registry's experiment: one run per version keeps each version's artifacts
        apart (the training run is named in the lineage tags). A version without
        weights (kind ``base`` or ``echo``) stores a descriptor.
        """
        return self._create_version(
            agent,
            lineage,
            model_dir,
            lineage.tags(),
            run_id=run_id,
            artifact_path=artifact_path,
            description=description,
        )

    def _create_version(
        self,
        agent: str,
        lineage: Lineage,
        model_dir: Path | None,
        tags: Mapping[str, str],
        *,
        run_id: str | None = None,
        artifact_path: str = "model",
        description: str = "",
    ) -> RegisteredVersion:
        self.ensure_model(agent)
        if lineage.kind in ("adapter", "model") and model_dir is None:
            raise RegistryError(f"a version of kind {lineage.kind!r} needs its folder")
        run_id = run_id or self._new_run(agent, lineage)
        with _staged(model_dir, lineage) as folder:
            self._call(
                f"logging {folder} to run {run_id}",
                lambda: self.client.log_artifacts(run_id, str(folder), artifact_path),
            )
        run = self._call(f"reading run {run_id}", lambda: self.client.get_run(run_id))
        source = f"{run.info.artifact_uri.rstrip('/')}/{artifact_path}"
        created = self._call(
            f"creating a version of {agent!r}",
            lambda: self.client.create_model_version(
                names.registered_model(agent),
                source=source,
                run_id=run_id,
                tags=dict(tags),
                description=description or _describe(lineage),
            ),
        )
        version = int(created.version)
        log.info("registered %s version %d (%s) from %s", agent, version, lineage.kind, source)
        return self.version(agent, version)

    def register_trained(
        self,
        agent: str,
        model_dir: Path,
        evaluation: EvalReport | None = None,
        *,
        pipeline_run_id: str | None = None,
        base_model: str | None = None,
    ) -> Registration:
        """Register what training wrote; make it the challenger when the gate passed.

        The evaluation must be of this model and agent. Registration is idempotent per
        pipeline run: run again with the same ``pipeline_run_id`` for the same trained
        model, it returns the version made before, finishing its registration (alias,
        gate verdict) when an earlier try stopped part-way, instead of making another.
        """
        lineage = lineage_from_outputs(
            model_dir,
            evaluation,
            agent=agent,
            pipeline_run_id=pipeline_run_id,
            base_model=base_model,
        )
        earlier = self._registered_before(agent, lineage)
        if (
            earlier is not None
            and not earlier.registration_pending
            and earlier.lineage.gate_passed != lineage.gate_passed
        ):
            raise RegistryError(
                f"pipeline run {lineage.pipeline_run_id} registered {agent} version "
                f"{earlier.version} with the gate's verdict "
                f"{'promote' if earlier.lineage.gate_passed else 'reject'}, and this try's "
                "evaluation says otherwise: a run registers one verdict; start a new run"
            )
        if earlier is not None and not earlier.registration_pending:
            log.info(
                "%s version %d is already registered for pipeline run %s",
                agent,
                earlier.version,
                lineage.pipeline_run_id,
            )
            return Registration(earlier, challenger=earlier.lineage.gate_passed)
        if earlier is not None:
            log.info("finishing the registration of %s version %d", agent, earlier.version)
            registered = earlier
        else:
            pending = {
                **{k: v for k, v in lineage.tags().items() if k not in _VERDICT_TAGS},
                names.TAG_REGISTRATION: names.REGISTRATION_PENDING,
            }
            registered = self._create_version(agent, lineage, model_dir, pending)
        return self._finish_registration(agent, registered, lineage, _measured(evaluation))

    def _finish_registration(
        self,
        agent: str,
        registered: RegisteredVersion,
        lineage: Lineage,
        measured: tuple[int | None] | None = None,
    ) -> Registration:
        """``measured``: the champion the evaluation compared with (its version, None for
        the base model standing in), where the report says; a challenger is aliased only
        while that is still the champion."""
        # Each write here is safe to repeat, and the verdict and the mark of completion
        # come last: until they are written the version neither looks like one the gate
        # let through nor is a challenger the rollout serves (see desired()).
        passed = lineage.gate_passed
        if passed and measured is not None:
            now = self.aliases(agent).get(names.CHAMPION)
            if now != measured[0]:
                log.warning(
                    "%s version %d stays unaliased: the gate compared it with %s, and the "
                    "champion is %s now; evaluate it again", agent, registered.version,
                    f"version {measured[0]}" if measured[0] else "the base model",
                    f"version {now}" if now else "none",
                )  # fmt: skip
                passed = False
        if passed:
            self.set_alias(agent, names.CHALLENGER, registered.version)
            if not any(e.endswith(_CHALLENGER_EVENT) for e in registered.events()):
                self.record(agent, registered.version, _CHALLENGER_EVENT)
        else:
            if names.CHALLENGER in registered.aliases:  # an earlier try judged it otherwise
                self.delete_alias(agent, names.CHALLENGER)
            reason = "; ".join(lineage.gate_reasons) or "no evaluation"
            log.info("%s version %d stays unaliased: gate %s", agent, registered.version, reason)
        finished = {k: v for k, v in lineage.tags().items() if k in _VERDICT_TAGS}
        finished[names.TAG_REGISTRATION] = names.REGISTRATION_COMPLETE
        self.set_tags(agent, registered.version, finished)
        return Registration(self.version(agent, registered.version), challenger=passed)

    def _registered_before(self, agent: str, lineage: Lineage) -> RegisteredVersion | None:
        """The version this pipeline run registered before for the same trained model
        (its training run, dataset and kind): a complete one first, else the newest."""
        run = lineage.pipeline_run_id
        if not run:
            return None
        query = f"name = '{names.registered_model(agent)}'"
        if "'" not in run:  # MLflow's filters cannot quote one; the tags are compared below
            query += f" AND tags.`{names.TAG_PIPELINE_RUN}` = '{run}'"
        found = self._call(
            f"finding versions of {agent!r} from pipeline run {run}",
            lambda: list(_pages(lambda token: self.client.search_model_versions(
                filter_string=query, page_token=token
            ))),
        )  # fmt: skip
        wanted = {
            names.TAG_PIPELINE_RUN: run,
            names.TAG_KIND: lineage.kind,
            names.TAG_TRAIN_RUN: lineage.train_run_id,
            names.TAG_DATASET_DIGEST: lineage.dataset_digest,
        }
        same = [
            _version(agent, mv)
            for mv in found
            if all((mv.tags or {}).get(k) == (v or None) for k, v in wanted.items())
        ]
        if not same:
            return None
        same.sort(key=lambda v: (not v.registration_pending, v.version))
        return self.version(agent, same[-1].version)

    def _new_run(self, agent: str, lineage: Lineage) -> str:
        def create() -> str:
            found = self.client.get_experiment_by_name(self.experiment)
            experiment_id = (
                found.experiment_id if found else self.client.create_experiment(self.experiment)
            )
            run = self.client.create_run(
                experiment_id,
                run_name=f"{agent}-{lineage.kind}",
                tags={names.TAG_AGENT: agent, names.TAG_KIND: lineage.kind},
            )
            self.client.set_terminated(run.info.run_id)
            return str(run.info.run_id)

        return self._call("creating a registration run", create)

    # -- reading -------------------------------------------------------------------------

    def aliases(self, agent: str) -> dict[str, int]:
        model = self._call(
            f"reading registered model {agent!r}",
            lambda: self.client.get_registered_model(names.registered_model(agent)),
        )
        return {alias: int(version) for alias, version in (model.aliases or {}).items()}

    def version(self, agent: str, version: int) -> RegisteredVersion:
        # search_model_versions leaves aliases empty; get_model_version fills them.
        mv = self._call(
            f"reading {agent} version {version}",
            lambda: self.client.get_model_version(names.registered_model(agent), str(version)),
        )
        return _version(agent, mv)

    def learned_from(self, first: datetime, last: datetime) -> list[RegisteredVersion]:
        """Versions of every agent whose training spans may include spans that started
        between ``first`` and ``last`` (by their lineage's span window)."""
        return [
            version
            for agent in self.agents()
            for version in self.versions(agent)
            if learned_from(version.lineage, first, last)
        ]

    def versions(self, agent: str) -> list[RegisteredVersion]:
        """Every version of the agent's model, newest first, with their aliases."""
        name = names.registered_model(agent)
        found = self._call(
            f"listing versions of {agent!r}",
            lambda: list(_pages(lambda token: self.client.search_model_versions(
                filter_string=f"name = '{name}'", page_token=token
            ))),
        )  # fmt: skip
        aliases = self.aliases(agent)
        by_version: dict[int, list[str]] = {}
        for alias, v in aliases.items():
            by_version.setdefault(v, []).append(alias)
        versions = [
            _version(agent, mv, tuple(sorted(by_version.get(int(mv.version), [])))) for mv in found
        ]
        return sorted(versions, key=lambda v: v.version, reverse=True)

    def desired(self, agent: str) -> Desired:
        """The champion and challenger the aliases name.

        A challenger that was rolled back is not desired again (its alias is
        removed once more, in case removing it failed the first time): to try it
        again, delete its ``spanmill.rollout.status`` tag and set the alias.
        """
        aliases = self.aliases(agent)
        champion = aliases.get(names.CHAMPION)
        challenger = aliases.get(names.CHALLENGER)
        versions: dict[int, RegisteredVersion] = {}
        for number in {v for v in (champion, challenger) if v is not None}:
            versions[number] = self.version(agent, number)
        if challenger is not None and versions[challenger].registration_pending:
            # Its registration stopped part-way; the alias stays for the retry that
            # finishes it, and until then the rollout does not serve it.
            log.warning(
                "%s version %d is named challenger but its registration did not finish; "
                "not rolling it out until it does",
                agent,
                challenger,
            )
            challenger = None
        if challenger is not None and (challenger == champion or versions[challenger].rolled_back):
            if versions[challenger].rolled_back and challenger != champion:
                log.warning(
                    "%s version %d was rolled back; removing the challenger alias again",
                    agent,
                    challenger,
                )
                self.delete_alias(agent, names.CHALLENGER)
            challenger = None
        return Desired(champion, challenger, versions)

    def download(self, agent: str, version: int, destination: Path) -> Path:
        """The version's artifacts, downloaded into ``destination``; returns the folder."""
        from mlflow.artifacts import download_artifacts

        registered = self.version(agent, version)
        destination.mkdir(parents=True, exist_ok=True)
        path = self._call(
            f"downloading {agent} version {version} from {registered.source}",
            lambda: download_artifacts(
                artifact_uri=registered.source,
                dst_path=str(destination),
                tracking_uri=self.tracking_uri,
            ),
        )
        return Path(path)

    # -- aliases and tags ------------------------------------------------------------------

    def set_alias(self, agent: str, alias: str, version: int) -> None:
        self._call(
            f"setting alias {alias!r} of {agent!r} to {version}",
            lambda: self.client.set_registered_model_alias(
                names.registered_model(agent), alias, str(version)
            ),
        )

    def delete_alias(self, agent: str, alias: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.delete_registered_model_alias(names.registered_model(agent), alias)
        except MlflowException as exc:
            if not self._missing(exc):
                raise RegistryError(f"MLflow at {self.tracking_uri}: {exc.message}") from None

    def set_tags(self, agent: str, version: int, tags: Mapping[str, str]) -> None:
        name = names.registered_model(agent)

        def write() -> None:
            for key, value in tags.items():
                self.client.set_model_version_tag(name, str(version), key, value)

        self._call(f"tagging {agent} version {version}", write)

    def record(
        self,
        agent: str,
        version: int,
        message: str,
        *,
        status: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Append a rollout event to the version's tag history (and set its status). A
        version rolled back stays so (it is never staged again) unless it is promoted (the
        champion alias set on it by a person); the event is recorded all the same."""
        current = self.version(agent, version)
        if current.rolled_back and status not in (None, names.ROLLED_BACK, "promoted"):
            status = None
        numbers = [
            int(k[len(names.ROLLOUT_EVENT_PREFIX) :])
            for k in current.tags
            if k.startswith(names.ROLLOUT_EVENT_PREFIX)
            and k[len(names.ROLLOUT_EVENT_PREFIX) :].isdigit()
        ]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        tags = {
            f"{names.ROLLOUT_EVENT_PREFIX}{max(numbers, default=0) + 1:03d}": f"{stamp} {message}"
        }
        if status is not None:
            tags[names.TAG_ROLLOUT_STATUS] = status
        if reason is not None:
            tags[names.TAG_ROLLOUT_REASON] = reason[:5000]
        self.set_tags(agent, version, tags)

    # -- people's actions ------------------------------------------------------------------

    def champion_history(self, agent: str) -> list[int]:
        model = self._call(
            f"reading registered model {agent!r}",
            lambda: self.client.get_registered_model(names.registered_model(agent)),
        )
        raw = (model.tags or {}).get(names.TAG_PREVIOUS_CHAMPIONS, "[]")
        try:
            return [int(v) for v in json.loads(raw)]
        except (ValueError, TypeError):
            return []

    def _push_history(self, agent: str, version: int) -> None:
        history = [*self.champion_history(agent), version][-_HISTORY_KEEP:]
        self._call(
            "recording the champion history",
            lambda: self.client.set_registered_model_tag(
                names.registered_model(agent), names.TAG_PREVIOUS_CHAMPIONS, json.dumps(history)
            ),
        )

    def _registered(self, agent: str, version: int) -> RegisteredVersion:
        """``version``, whose registration finished; RegistryError when it is absent or
        its registration stopped part-way (its gate verdict is not written yet)."""
        wanted = self.version(agent, version)  # fails with a clear message when absent
        if wanted.registration_pending:
            raise RegistryError(
                f"the registration of {agent} version {version} did not finish (pipeline "
                f"run {wanted.lineage.pipeline_run_id or 'unknown'}); retry that pipeline run, "
                "or run `spanmill models register` again with the same --pipeline-run, to "
                "finish it before putting it in service"
            )
        return wanted

    def make_challenger(self, agent: str, version: int, *, reason: str) -> None:
        """Name ``version`` the challenger by hand: the controller rolls it out step by step."""
        self._registered(agent, version)
        self.set_alias(agent, names.CHALLENGER, version)
        self.record(agent, version, f"challenger: {reason}")

    def serve_base(self, agent: str, base_model: str) -> tuple[int, bool]:
        """The agent's champion, and whether it is new: where the agent has none, the
        base model (as given: a model folder, a Hugging Face id, an object store path) is
        registered as its first version and made champion, which the rollout controller
        then serves under the agent's name. An agent with a champion is left as it is."""
        if agent in self.agents():
            champion = self.aliases(agent).get(names.CHAMPION)
            if champion is not None:
                return champion, False
        version = self.register(agent, Lineage(kind="base", base_model=base_model)).version
        self.promote(agent, version, reason="the base model serves first")
        return version, True

    def promote(
        self, agent: str, version: int, *, reason: str = "promoted", record: bool = True
    ) -> int | None:
        """Make ``version`` the champion; returns the champion it replaces.

        The replaced champion is remembered, so that :meth:`rollback` can return to it.
        ``record=False`` leaves the version's event history to the caller.
        """
        self._registered(agent, version)
        aliases = self.aliases(agent)
        previous = aliases.get(names.CHAMPION)
        if previous == version:
            return previous
        if previous is not None:
            self._push_history(agent, previous)
        self.set_alias(agent, names.CHAMPION, version)
        if aliases.get(names.CHALLENGER) == version:
            self.delete_alias(agent, names.CHALLENGER)
        if record:
            self.record(agent, version, f"champion: {reason}", status="promoted")
        return previous

    def rollback(
        self, agent: str, *, to: int | None = None, reason: str = "rolled back by hand"
    ) -> int:
        """Stop the challenger, or else return the champion alias to an earlier version.

        Returns the version that was rolled back. A challenger in its canary is
        stopped first; with none, the champion goes back to ``to`` or to the
        champion it replaced.
        """
        aliases = self.aliases(agent)
        challenger = aliases.get(names.CHALLENGER)
        champion = aliases.get(names.CHAMPION)
        if challenger is not None and challenger != champion and to is None:
            self.record(
                agent, challenger, f"rolled back: {reason}", status=names.ROLLED_BACK, reason=reason
            )
            self.delete_alias(agent, names.CHALLENGER)
            return challenger
        if champion is None:
            raise RegistryError(f"{agent!r} has no champion to roll back")
        history = [v for v in self.champion_history(agent) if v != champion]
        target = to if to is not None else (history[-1] if history else None)
        if target is None:
            raise RegistryError(
                f"{agent!r} has no earlier champion on record; name the version to return "
                "to with --to"
            )
        self.version(agent, target)
        self.set_alias(agent, names.CHAMPION, target)
        remaining = [v for v in self.champion_history(agent) if v != target]
        self._call(
            "recording the champion history",
            lambda: self.client.set_registered_model_tag(
                names.registered_model(agent), names.TAG_PREVIOUS_CHAMPIONS, json.dumps(remaining)
            ),
        )
        self.record(
            agent,
            champion,
            f"rolled back to {target}: {reason}",
            status=names.ROLLED_BACK,
            reason=reason,
        )
        self.record(agent, target, f"champion again: {agent} version {champion} was rolled back")
        return champion


def _version(agent: str, mv: Any, aliases: tuple[str, ...] | None = None) -> RegisteredVersion:
    return RegisteredVersion(
        agent=agent,
        version=int(mv.version),
        source=str(mv.source),
        run_id=mv.run_id or None,
        tags=dict(mv.tags or {}),
        aliases=tuple(sorted(mv.aliases or ())) if aliases is None else aliases,
        created_at=(mv.creation_timestamp or 0) / 1000,
        description=mv.description or "",
    )


def _pages(fetch: Callable[[str | None], Any]) -> Iterator[Any]:
    token: str | None = None
    while True:
        page = fetch(token)
        yield from page
        token = page.token
        if not token:
            return


def _describe(lineage: Lineage) -> str:
    if lineage.kind == "adapter":
        return f"LoRA adapter on {lineage.base_model}"
    if lineage.kind == "model":
        return "full model"
    if lineage.kind == "base":
        return f"base model {lineage.base_model}, served as it is"
    return "echo: answers with the last user message"


@contextmanager
def _staged(model_dir: Path | None, lineage: Lineage) -> Iterator[Path]:
    """The folder to log: the model folder, or a descriptor for a version without weights."""
    if model_dir is not None:
        if not Path(model_dir).is_dir():
            raise RegistryError(f"{model_dir} is not a folder")
        yield Path(model_dir)
        return
    with tempfile.TemporaryDirectory(prefix="spanmill-register-") as tmp:
        folder = Path(tmp)
        (folder / DESCRIPTOR).write_text(
            json.dumps({"kind": lineage.kind, "base_model": lineage.base_model}, indent=2)
        )
        yield folder
