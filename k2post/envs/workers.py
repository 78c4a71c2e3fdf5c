"""Reward execution: score model output in isolated worker processes, with a timeout per call.

Scoring untrusted output can raise, hang or blow up memory. `RewardPool` runs it in worker
processes (forkserver or spawn; never fork). A worker builds each environment once by registry
name + config dict and keeps it; an exception becomes `Reward(value=<reward_range min>,
error="ValueError: ...")`, a hang becomes `error="timeout after 5.0s"` and the worker (with its
process group) is killed and replaced. The run never crashes on a bad response.

Infrastructure failures are not rewards: a worker that dies mid-job, the pool's own timeout, or a reward the env
marks `infra_failure` (its sandbox could not start) says nothing about the response. Such an item is re-scored
once (`PoolStats.rescored`); if it fails again its reward keeps `infra_failure=True` (`PoolStats.infra_failures`)
and the RL loop leaves it out of training and counts it (docs/RL.md), never trains on it as 0.

    with RewardPool(num_workers=2, timeout_s=5.0) as pool:
        rewards = pool.score_batch([("math", {}, task, "\\boxed{4}"), ...])
        print(pool.stats.scores_per_s)

Multi-turn episodes are scored with `ScoreItem(env, task, turns=[assistant dicts])` (replayed
through reset/step, then score_state) or `ScoreItem(env, task, state=final_state)` (the state
must pickle). `DirectScorer` has the same interface in-process (no isolation, no timeout). A reward outside the env's
`reward_range` (or not finite) is an error too: value = the range's minimum, the error text says why. A scorer
may return a plain float (as verl's and TRL's reward functions do): it is the value, with a breakdown naming the
scorer (`{"MyEnv.score": 0.5}`). An error text ends with ` (at file.py:LINE)`: the traceback's last frame inside
the env's own file (for a bad return value, the line defining its scoring method).
Throughput: `python benchmarks/reward_throughput.py`.

Environments are found in a worker by registry name; one registered outside the built-ins
and entry points (a test module, a script) is imported there from its class's module, so
define it at module top level.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import math
import multiprocessing
import multiprocessing.util
import numbers
import os
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Literal

from pydantic import ValidationError

from k2post.chat.types import Message
from k2post.config.loader import format_validation_error
from k2post.envs.base import Environment, MultiTurnEnvironment, Reward, Task
from k2post.envs.registry import PLUGINS_ENV_VAR, get_environment, registered_environments

StartMethod = Literal["forkserver", "spawn"]
ERROR_CHARS = 500
MAX_START_FAILURES = 3


class RewardPoolError(RuntimeError):
    """The pool itself cannot work (workers fail to start); never raised for a bad response."""


@dataclass(frozen=True)
class ScoreItem:
    """One thing to score: a response, a list of assistant turns to replay, or a final state."""

    env: str
    task: Task
    response: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    turns: list[dict[str, Any] | Message] | None = None
    state: Any = None


@dataclass(frozen=True)
class EnvHint:
    """Where the main process found an environment class (so a worker can import it too)."""

    module: str
    file: str | None
    floor: float


@dataclass
class PoolStats:
    """Cumulative counters of a pool (or direct scorer); `scores_per_s` over time spent scoring."""

    workers: int
    scored: int = 0
    errors: int = 0
    timeouts: int = 0
    restarts: int = 0
    rescored: int = 0
    infra_failures: int = 0
    busy_s: float = 0.0

    @property
    def scores_per_s(self) -> float:
        return self.scored / self.busy_s if self.busy_s > 0 else 0.0


def as_item(item: ScoreItem | Sequence[Any]) -> ScoreItem:
    """Accept a `ScoreItem` or an `(env_name, config_dict, task, response)` tuple."""
    if isinstance(item, ScoreItem):
        return item
    if len(item) != 4:
        raise ValueError(f"score item must be (env_name, config, task, response), got {len(item)} values")
    name, config, task, response = item
    return ScoreItem(env=name, task=task, response=response, config=dict(config or {}))


def env_key(name: str, config: dict[str, Any]) -> str:
    """Cache key of an environment instance: name + canonical JSON of its config dict."""
    return name + "|" + json.dumps(config, sort_keys=True, default=str)


def error_text(err: BaseException, limit: int = ERROR_CHARS) -> str:
    """`ValueError: message` on one line, cut to `limit` characters."""
    message = " ".join(str(err).split())
    text = f"{type(err).__name__}: {message}" if message else type(err).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def failed(floor: float, error: str, infra: bool = False) -> Reward:
    """The reward of a failed scoring call: the env's minimum, with the error recorded (`infra`: the failure is
    the infrastructure's, not the response's)."""
    return Reward(value=floor, error=error, infra_failure=infra)


def infra_indices(rewards: Sequence[Reward]) -> list[int]:
    """Positions of the rewards whose scoring failed for an infrastructure reason."""
    return [i for i, reward in enumerate(rewards) if reward.infra_failure]


def rescore_infra(score: Any, items: list[ScoreItem], rewards: list[Reward], stats: PoolStats) -> list[Reward]:
    """`rewards` with every infrastructure failure re-scored once by `score(items)`; what fails again keeps its
    `infra_failure` flag (counted in `stats.infra_failures`)."""
    again = infra_indices(rewards)
    if again:
        stats.rescored += len(again)
        for index, reward in zip(again, score([items[i] for i in again])):
            rewards[index] = reward
    stats.infra_failures += len(infra_indices(rewards))
    return rewards


def reward_floor(name: str) -> float:
    """Lowest reward of environment `name` (0.0 when the name is unknown)."""
    try:
        return float(get_environment(name).reward_range[0])
    except Exception:  # an unknown env is reported per item; the floor just needs a number
        return 0.0


def replay_turns(env: Environment, task: Task, turns: Sequence[dict[str, Any] | Message]) -> Reward:
    """Reset, step each assistant turn, score the final state (multi-turn environments only)."""
    if not isinstance(env, MultiTurnEnvironment):
        raise TypeError(f"environment {env.name!r} is single-turn: give a response, not turns")
    state = env.reset(task)
    for position, turn in enumerate(turns):
        message = turn if isinstance(turn, Message) else Message.from_openai(turn)
        if message.role != "assistant":
            raise ValueError(f"turn {position}: role must be 'assistant', got {message.role!r}")
        result = env.step(state, message)
        if result.done and position < len(turns) - 1:
            extra = len(turns) - position - 1
            raise ValueError(f"episode ended after turn {position} but {extra} more turns were given")
    return env.score_state(task, state)


def as_reward(result: Any, scorer: str = "scorer") -> Reward:
    """A scorer's result as a Reward: a Reward as is; a plain number (what verl's and TRL's reward functions
    return) is the value, with a breakdown naming `scorer` (e.g. `{"MyEnv.score": 0.5}`); TypeError otherwise."""
    if isinstance(result, Reward):
        return result
    if isinstance(result, numbers.Real):
        return Reward(value=float(result), breakdown={scorer: float(result)})
    raise TypeError(f"{scorer} returned {type(result).__name__}, expected a Reward or a float")


def check_reward(reward: Any, reward_range: tuple[float, float] | None = None, scorer: str = "scorer") -> Reward:
    """`reward` (a Reward, or a plain number: `as_reward`) if its value is finite and inside `reward_range` (when
    given); TypeError/ValueError otherwise (the caller records it as an error reward at the range's minimum)."""
    reward = as_reward(reward, scorer)
    if not math.isfinite(reward.value):
        raise ValueError(f"{scorer} returned a non-finite reward {reward.value!r}")
    if reward_range is not None and not reward_range[0] <= reward.value <= reward_range[1]:
        low, high = reward_range
        raise ValueError(f"{scorer} returned {reward.value!r}, outside the env's reward_range [{low:g}, {high:g}]")
    return reward


def scorer_method(item: ScoreItem) -> str:
    """The method that scores `item`: `score`, or `score_state` for turns and final states."""
    return "score" if item.response is not None else "score_state"


def score_item(env: Environment, item: ScoreItem) -> Reward:
    """Score one item with `env` (may raise; callers turn that into an error reward)."""
    bounds = tuple(env.reward_range)
    scorer = f"{type(env).__name__}.{scorer_method(item)}"
    if item.turns is not None:
        return check_reward(replay_turns(env, item.task, item.turns), bounds, scorer)
    if item.response is not None:
        return check_reward(env.score(item.task, item.response), bounds, scorer)
    if not isinstance(env, MultiTurnEnvironment):
        raise TypeError(f"environment {env.name!r} is single-turn: give a response, not a state")
    return check_reward(env.score_state(item.task, item.state), bounds, scorer)


def _shown_path(path: str) -> str:
    """`path` relative to the working directory when it lies inside it, else as it is."""
    try:
        return os.path.relpath(path) if os.path.abspath(path).startswith(os.getcwd() + os.sep) else path
    except ValueError:
        return path


def _scorer_files(env: Environment) -> set[str]:
    """Files defining the env's class and its bases, k2post's own base classes left out."""
    core = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the k2post package
    files = {getattr(sys.modules.get(cls.__module__), "__file__", None) for cls in type(env).__mro__}
    return {os.path.abspath(f) for f in files if f and not os.path.abspath(f).startswith(core + os.sep)}


def scorer_location(err: BaseException, env: Environment, method: str) -> str | None:
    """`file:line` of the scorer: the traceback's last frame inside the env's own file(s), else (a bad return
    value: the error is raised after the scorer returned) the line that defines the scoring `method`."""
    files = _scorer_files(env)
    frames = [f for f in traceback.extract_tb(err.__traceback__) if os.path.abspath(f.filename) in files]
    if frames:
        return f"{_shown_path(frames[-1].filename)}:{frames[-1].lineno}"
    code = getattr(getattr(type(env), method, None), "__code__", None)
    if code is None or os.path.abspath(code.co_filename) not in files:
        return None
    return f"{_shown_path(code.co_filename)}:{code.co_firstlineno}"


def scorer_error_text(err: BaseException, env: Environment | None, method: str) -> str:
    """`error_text(err)` followed by ` (at file:line)` of the scorer (`method`: `score` or `score_state`), when the
    env is known and it is found."""
    where = scorer_location(err, env, method) if env is not None else None
    if where is None:
        return error_text(err)
    suffix = f" (at {where})"
    return error_text(err, ERROR_CHARS - len(suffix)) + suffix


@contextlib.contextmanager
def _main_file_hidden_if_missing() -> Iterator[None]:
    """Code run as `python -` / `python -c` has `__main__.__file__` = '<stdin>' (or none): multiprocessing would
    make each new worker re-run that missing path and die with a traceback. Hidden while a worker starts."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or os.path.isfile(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def unimportable(name: str, hint: EnvHint) -> str | None:
    """Why reward workers cannot import environment `name` (a class defined in `python -` / `python -c` code,
    which has no file), or None."""
    if hint.module != "__main__" or (hint.file and os.path.isfile(hint.file)):
        return None
    return (
        f"environment {name!r} is defined in a script read from stdin or -c: reward worker processes cannot "
        "import it; save it to a .py file (or a module) and run that, or score with DirectScorer"
    )


def _import_hint(hint: EnvHint) -> None:
    """Import the module that registers an environment (a script's `__main__` by its file)."""
    if hint.module != "__main__":
        importlib.import_module(hint.module)
        return
    if hint.file is None or "__k2post_main__" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location("__k2post_main__", hint.file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the script {hint.file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["__k2post_main__"] = module
    spec.loader.exec_module(module)


def build_environment(name: str, config: dict[str, Any]) -> Environment:
    """Instantiate `name`; a bad config raises ValueError "environment 'x' config: field: problem"."""
    cls = get_environment(name)
    try:
        validated = cls.config_cls.model_validate(config)
    except ValidationError as err:
        raise ValueError(format_validation_error(err, cls.config_cls, f"environment {name!r} config")) from None
    return cls(validated)


class EnvCache:
    """Environment instances by (name, config); builds each once."""

    def __init__(self) -> None:
        self._envs: dict[str, Environment] = {}

    def get(self, name: str, config: dict[str, Any], hint: EnvHint | None = None) -> tuple[Environment, bool]:
        """The instance for (name, config) and whether it was just built."""
        key = env_key(name, config)
        if key in self._envs:
            return self._envs[key], False
        if hint is not None and name not in registered_environments():
            _import_hint(hint)
        env = build_environment(name, config)
        self._envs[key] = env
        return env, True


class ScoreTimeout(Exception):
    """A direct score ran past its time (raised by SIGALRM in the main thread)."""


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ScoreTimeout in the main thread after `seconds` of wall time (no limit off the main thread, where
    signals cannot be delivered, or with None). Code blocked inside one C call is interrupted when it returns."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise ScoreTimeout(f"scoring took longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class DirectScorer:
    """In-process scoring with the pool's error capture and, in the main thread, a time limit per item
    (`timeout_s`; a scorer past it gives an error reward): the fast path (no process isolation)."""

    def __init__(self, timeout_s: float | None = 30.0) -> None:
        self.envs = EnvCache()
        self.stats = PoolStats(workers=0)
        self.timeout_s = timeout_s

    def score(self, item: ScoreItem | Sequence[Any]) -> Reward:
        item = as_item(item)
        env = None
        try:
            with time_limit(self.timeout_s):
                env, _ = self.envs.get(item.env, item.config)
                return score_item(env, item)
        except Exception as err:  # junk output must not crash the caller; ScoreTimeout included
            text = scorer_error_text(err, env, scorer_method(item))
            return failed(reward_floor(item.env), text, infra=isinstance(err, ScoreTimeout))

    def score_batch(self, items: Iterable[ScoreItem | Sequence[Any]]) -> list[Reward]:
        """Rewards in input order; infrastructure failures (the time limit) re-scored once (`rescore_infra`)."""
        start = time.perf_counter()
        listed = [as_item(item) for item in items]
        rewards = rescore_infra(self._score_all, listed, self._score_all(listed), self.stats)
        self.stats.busy_s += time.perf_counter() - start
        self.stats.scored += len(rewards)
        self.stats.errors += sum(r.error is not None for r in rewards)
        return rewards

    def _score_all(self, items: list[ScoreItem]) -> list[Reward]:
        return [self.score(item) for item in items]


# ---------------------------------------------------------------- worker process side


def _watch_parent(parent_pid: int) -> None:
    """Exit this worker when its parent goes away (a daemon thread; scoring keeps the main one)."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def _setup_worker(sys_path: list[str], plugins: str = "") -> None:
    """Own process group (so a kill takes its children too), no Ctrl-C noise, the parent's sys.path and
    `module:Class` env plugins (a forkserver started earlier would not have them in its environment)."""
    if plugins:
        os.environ[PLUGINS_ENV_VAR] = plugins
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[:] = sys_path + [p for p in sys.path if p not in sys_path]
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()


def _send(conn: Connection, message: tuple[Any, ...], floor: float) -> None:
    """Send a message; a reward that does not pickle is replaced by an error reward."""
    try:
        conn.send(message)
    except Exception as err:  # pickling fails before anything is written
        if message[0] != "done":
            raise
        conn.send(("done", message[1], failed(floor, f"reward does not pickle: {error_text(err)}")))


def _serve_one(conn: Connection, cache: EnvCache, request: tuple[int, ScoreItem, EnvHint]) -> None:
    """Build (once) and score one request; send 'built' then 'done'."""
    seq, item, hint = request
    try:
        env, fresh = cache.get(item.env, item.config, hint)
    except Exception as err:
        conn.send(("done", seq, failed(hint.floor, error_text(err))))
        return
    if fresh:
        conn.send(("built", seq))
    try:
        reward = score_item(env, item)
    except (Exception, SystemExit) as err:  # an env calling sys.exit is still just a bad score
        reward = failed(hint.floor, scorer_error_text(err, env, scorer_method(item)))
    _send(conn, ("done", seq, reward), hint.floor)


def worker_main(conn: Connection, sys_path: list[str], plugins: str = "") -> None:
    """Worker loop: load the registry, say ready, then serve (seq, item, hint) until None/EOF."""
    _setup_worker(sys_path, plugins)
    try:
        registered_environments()
    except Exception as err:  # reported per item by make_environment; keep serving
        print(f"k2post reward worker: registry: {error_text(err)}", file=sys.stderr)
    cache = EnvCache()
    try:
        conn.send(("ready", os.getpid()))
        while (request := conn.recv()) is not None:
            _serve_one(conn, cache, request)
    except (EOFError, OSError):  # the pool went away: leave quietly
        return


# ---------------------------------------------------------------- pool side


@dataclass
class _Job:
    index: int
    seq: int
    key: str
    deadline: float


@dataclass
class _Worker:
    proc: BaseProcess
    conn: Connection
    started: float
    ready: bool = False
    job: _Job | None = None
    built: set[str] = field(default_factory=set)


def kill_worker(proc: BaseProcess) -> None:
    """SIGKILL a worker we started and its process group (sandbox children), then reap it."""
    pid = proc.pid
    if pid is not None and proc.exitcode is None:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                proc.kill()
        except (ProcessLookupError, PermissionError):
            pass
    proc.join(timeout=5)


def _shutdown(workers: list[_Worker]) -> None:
    """Ask every worker to exit, then kill what is left (also runs at interpreter exit)."""
    for worker in workers:
        try:
            worker.conn.send(None)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 2.0
    for worker in workers:
        worker.proc.join(timeout=max(0.0, deadline - time.monotonic()))
        kill_worker(worker.proc)
        worker.conn.close()
    workers.clear()


class RewardPool:
    """Score batches in `num_workers` worker processes, `timeout_s` per call (see module doc)."""

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        start_method: StartMethod = "forkserver",
        setup_timeout_s: float = 120.0,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if timeout_s <= 0 or setup_timeout_s <= 0:
            raise ValueError(f"timeouts must be > 0, got timeout_s={timeout_s}, setup_timeout_s={setup_timeout_s}")
        self.timeout_s = float(timeout_s)
        self.setup_timeout_s = float(setup_timeout_s)
        self.stats = PoolStats(workers=num_workers)
        self._ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(["k2post.envs.workers"])
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._hints: dict[str, EnvHint | str] = {}
        self._seq = 0
        self._start_failures = 0
        self._finalizer = multiprocessing.util.Finalize(self, _shutdown, args=(self._workers,), exitpriority=10)
        for _ in range(num_workers):
            self._workers.append(self._start_worker())

    # -- lifecycle

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        self._finalizer()

    def worker_pids(self) -> list[int]:
        """PIDs of the current workers (tests, monitoring)."""
        return [w.proc.pid for w in self._workers if w.proc.pid is not None]

    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        plugins = os.environ.get(PLUGINS_ENV_VAR, "")
        proc = self._ctx.Process(
            target=worker_main, args=(child_conn, list(sys.path), plugins), name="k2post-reward-worker"
        )
        with _main_file_hidden_if_missing():
            proc.start()
        child_conn.close()
        return _Worker(proc=proc, conn=parent_conn, started=time.monotonic())

    def _replace(self, worker: _Worker, counts_as_restart: bool = True) -> None:
        kill_worker(worker.proc)
        worker.conn.close()
        self._workers[self._workers.index(worker)] = self._start_worker()
        self.stats.restarts += int(counts_as_restart)

    # -- scoring

    def score(self, item: ScoreItem | Sequence[Any]) -> Reward:
        """Score one item (a batch of one)."""
        return self.score_batch([item])[0]

    def score_batch(self, items: Iterable[ScoreItem | Sequence[Any]]) -> list[Reward]:
        """Rewards in input order; errors and timeouts become error rewards, never exceptions."""
        with self._lock:
            if not self._workers:
                raise RewardPoolError("the reward pool is closed")
            start = time.perf_counter()
            listed = [as_item(item) for item in items]
            try:
                rewards = rescore_infra(self._run, listed, self._run(listed), self.stats)
            except BaseException:  # Ctrl-C, start failure: no stale job may leak into the next batch
                self._abandon_jobs()
                raise
            self.stats.busy_s += time.perf_counter() - start
            self.stats.scored += len(rewards)
            self.stats.errors += sum(r.error is not None for r in rewards)
            return rewards

    def _abandon_jobs(self) -> None:
        """Replace every worker that is still scoring (its result would belong to a dead batch)."""
        for worker in list(self._workers):
            if worker.job is not None:
                worker.job = None
                self._replace(worker, counts_as_restart=False)

    def _hint(self, name: str) -> EnvHint | str:
        """Import hint for `name`, or the error text when the name is unknown here."""
        if name not in self._hints:
            try:
                cls = get_environment(name)
                module = sys.modules.get(cls.__module__)
                floor = float(cls.reward_range[0])
                self._hints[name] = EnvHint(cls.__module__, getattr(module, "__file__", None), floor)
            except Exception as err:
                self._hints[name] = error_text(err)
            else:
                self._hints[name] = unimportable(name, self._hints[name]) or self._hints[name]
        return self._hints[name]

    def _run(self, items: list[ScoreItem]) -> list[Reward]:
        results: list[Reward | None] = [None] * len(items)
        queue: deque[int] = deque()
        for index, item in enumerate(items):
            hint = self._hint(item.env)
            if isinstance(hint, str):
                results[index] = failed(0.0, hint)
            else:
                queue.append(index)
        while queue or any(w.job for w in self._workers):
            self._dispatch(queue, items, results)
            self._poll(items, results)
        return [r if r is not None else failed(0.0, "internal error: no result", infra=True) for r in results]

    def _dispatch(self, queue: deque[int], items: list[ScoreItem], results: list[Reward | None]) -> None:
        for worker in list(self._workers):
            if not queue:
                return
            if worker.ready and worker.job is None:
                index = queue.popleft()
                outcome = self._send_job(worker, index, items)
                if outcome == "dead":
                    queue.appendleft(index)  # it died while idle: replace it, keep the item
                    self._replace(worker)
                elif outcome != "sent":
                    results[index] = failed(self._floor(items[index]), outcome)

    def _send_job(self, worker: _Worker, index: int, items: list[ScoreItem]) -> str:
        """'sent', 'dead' (the worker is gone) or the error text of an item that does not pickle."""
        item = items[index]
        hint = self._hint(item.env)
        assert isinstance(hint, EnvHint)
        self._seq += 1
        key = env_key(item.env, item.config)
        wait_s = self.timeout_s if key in worker.built else self.setup_timeout_s
        try:
            worker.conn.send((self._seq, item, hint))
        except OSError:
            return "dead"
        except Exception as err:  # pickling fails before anything is written
            return f"score item does not pickle: {error_text(err)}"
        worker.job = _Job(index=index, seq=self._seq, key=key, deadline=time.monotonic() + wait_s)
        return "sent"

    def _poll(self, items: list[ScoreItem], results: list[Reward | None]) -> None:
        waiting = [w for w in self._workers if w.job is not None or not w.ready]
        if not waiting:
            return
        timeout = max(0.0, min(self._deadline(w) for w in waiting) - time.monotonic())
        ready = set(wait([w.conn for w in waiting], timeout=timeout))
        for worker in list(waiting):
            if worker.conn in ready:
                self._receive(worker, items, results)
            elif time.monotonic() >= self._deadline(worker):
                self._expire(worker, items, results)

    def _deadline(self, worker: _Worker) -> float:
        return worker.job.deadline if worker.job is not None else worker.started + self.setup_timeout_s

    def _receive(self, worker: _Worker, items: list[ScoreItem], results: list[Reward | None]) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            self._died(worker, items, results)
            return
        kind = message[0]
        if kind == "ready":
            worker.ready = True
            self._start_failures = 0
        elif kind == "built" and worker.job is not None:
            worker.built.add(worker.job.key)
            worker.job.deadline = time.monotonic() + self.timeout_s
        elif kind == "done" and worker.job is not None and message[1] == worker.job.seq:
            worker.built.add(worker.job.key)
            results[worker.job.index] = message[2]
            worker.job = None

    def _died(self, worker: _Worker, items: list[ScoreItem], results: list[Reward | None]) -> None:
        worker.proc.join(timeout=5)
        code = worker.proc.exitcode
        if worker.job is not None:
            job, worker.job = worker.job, None
            what = f"reward worker died (exit code {code})"
            results[job.index] = failed(self._floor(items[job.index]), what, infra=True)
        elif not worker.ready:
            self._start_failed(f"exit code {code}")
        self._replace(worker)

    def _expire(self, worker: _Worker, items: list[ScoreItem], results: list[Reward | None]) -> None:
        if worker.job is None:
            self._start_failed(f"not ready after {self.setup_timeout_s}s")
            self._replace(worker)
            return
        job, worker.job = worker.job, None
        building = job.key not in worker.built
        what = f"timeout after {self.timeout_s}s"
        if building:
            what = f"environment setup timed out after {self.setup_timeout_s}s"
        results[job.index] = failed(self._floor(items[job.index]), what, infra=True)
        self.stats.timeouts += 1
        self._replace(worker)

    def _start_failed(self, why: str) -> None:
        self._start_failures += 1
        if self._start_failures >= MAX_START_FAILURES:
            self.close()
            raise RewardPoolError(f"reward workers failed to start {MAX_START_FAILURES} times in a row ({why})")

    def _floor(self, item: ScoreItem) -> float:
        hint = self._hint(item.env)
        return hint.floor if isinstance(hint, EnvHint) else 0.0
