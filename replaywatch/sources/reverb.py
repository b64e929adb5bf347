"""Reverb source: one `ServerInfo` RPC per poll, with a real deadline.

The call is plain grpcio (see reverb_wire for why not `reverb.Client`): it
answers in well under a millisecond on loopback and fails within the poll's
timeout on a dead or frozen server, in fractions of a second rather than
Reverb's whole-second deadlines. Parsing is split from the call:
`snapshot_from_info(info, target, observed_at)` is pure and is what tests target.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import grpc

from replaywatch.errors import SourceProtocolError, SourceTimeout, SourceUnreachable
from replaywatch.model import (
    NO_ANSWER,
    KeyDistributionOptions,
    MemorySnapshot,
    PollOutcome,
    RateLimiterInfo,
    SourceKind,
    TableSnapshot,
    TableWorkerTime,
)
from replaywatch.sources import PolledSource, reverb_wire
from replaywatch.sources.memory import MemoryWatch

# Reconnect quickly after a server restart: gRPC's default backoff grows to
# two minutes, far longer than a person watching a restarted job will wait.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.enable_http_proxy", 0),  # the target is a loopback or cluster address
]


def distribution_from_info(options: Any) -> KeyDistributionOptions:
    """A `KeyDistributionOptions` message: its `distribution` oneof names the kind."""
    kind = options.WhichOneof("distribution") or "unknown"
    return _distribution(
        kind,
        options.prioritized.priority_exponent if kind == "prioritized" else None,
        options.heap.min_heap if kind == "heap" else None,
        options.is_deterministic,
    )


@functools.lru_cache(maxsize=256)
def _distribution(kind: str, priority_exponent: float | None, min_heap: bool | None,
                  is_deterministic: bool) -> KeyDistributionOptions:
    # A table's sampler and remover never change, yet every poll decodes them: one
    # shared (immutable) object per distinct value keeps the history's 900 points
    # per table from holding 1800 copies the garbage collector must walk.
    return KeyDistributionOptions(kind, priority_exponent, min_heap, is_deterministic)


def snapshot_from_info(info: Any, target: str, observed_at: float) -> TableSnapshot:
    """Turns one decoded `TableInfo` message (reverb_wire) into a snapshot.

    An absent field reads as its zero, as proto3 (Reverb's syntax) omits zeros.
    """
    rl = info.rate_limiter_info
    wt = info.table_worker_time
    return TableSnapshot(
        target=target,
        name=info.name,
        observed_at=observed_at,
        max_size=info.max_size,
        current_size=info.current_size,
        max_times_sampled=info.max_times_sampled,
        num_episodes=info.num_episodes,
        num_deleted_episodes=info.num_deleted_episodes,
        num_unique_samples=info.num_unique_samples,
        sampler=distribution_from_info(info.sampler_options),
        remover=distribution_from_info(info.remover_options),
        rate_limiter=RateLimiterInfo(
            samples_per_insert=rl.samples_per_insert,
            min_diff=rl.min_diff,
            max_diff=rl.max_diff,
            min_size_to_sample=rl.min_size_to_sample,
            inserts=rl.insert_stats.completed,
            samples=rl.sample_stats.completed,
        ),
        worker_time=TableWorkerTime(
            running_ms=wt.running_ms,
            sampling_ms=wt.sampling_ms,
            inserting_ms=wt.inserting_ms,
            sleeping_ms=wt.sleeping_ms,
            waiting_for_sampling_ms=wt.waiting_for_sampling_ms,
            waiting_for_inserts_ms=wt.waiting_for_inserts_ms,
        ),
        has_signature=info.HasField("signature"),
        item_bytes=(reverb_wire.signature_item_bytes(info.signature)
                    if info.HasField("signature") else None),
    )


def snapshots_from_response(raw: bytes, target: str, observed_at: float) -> list[TableSnapshot]:
    try:
        infos = reverb_wire.decode_server_info(raw)
    except reverb_wire.WireError as e:
        raise SourceProtocolError(f"{target}: not a Reverb ServerInfo response ({e})") from e
    return [snapshot_from_info(info, target, observed_at) for info in infos]


class ReverbSource(PolledSource):
    """Polls one Reverb server's `ServerInfo` with a per-call deadline."""

    kind = SourceKind.REVERB

    def __init__(
        self,
        address: str,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
        perf: Callable[[], float] = time.perf_counter,
        memory: MemoryWatch | None = None,
    ):
        super().__init__(address, timeout_s, clock, perf)
        self._channel: grpc.Channel | None = None
        self._call: Any = None
        # The server's process, where this host can read it (sources/memory.py).
        self._memory = memory

    def _stub(self) -> Any:
        # The channel is made lazily so that constructing a source does no I/O.
        if self._call is None:
            self._channel = grpc.insecure_channel(self.name, options=_CHANNEL_OPTIONS)
            self._call = self._channel.unary_unary(
                reverb_wire.SERVICE_METHOD,
                request_serializer=lambda _: b"",  # ServerInfoRequest has no fields
                response_deserializer=lambda raw: raw,
            )
        return self._call

    def fetch(self) -> bytes:
        """The raw `ServerInfoResponse`; raises a SourceError on failure."""
        try:
            return self._stub()(None, timeout=self._timeout_s, wait_for_ready=False)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise SourceTimeout(
                    f"{self.name}: ServerInfo {NO_ANSWER} {self._timeout_s:g}s"
                ) from None
            if code == grpc.StatusCode.UNAVAILABLE and _FROZEN in (_details(e) or ""):
                # It accepted the connection and never spoke HTTP/2: alive but not answering
                # (a frozen process), as a deadline on an open channel would say; gRPC reports
                # it this way when the channel happened to be (re)connecting at the freeze.
                raise SourceTimeout(
                    f"{self.name}: ServerInfo {NO_ANSWER} {self._timeout_s:g}s "
                    "(connected, no answer)") from None
            if code == grpc.StatusCode.UNAVAILABLE and any(
                    cut in (_details(e) or "") for cut in _CONNECT_CUT):
                # The connection itself did not complete before the deadline: nothing
                # refused it. A server whose threads all wait on its table lock (a
                # checkpoint) takes no new connection in time, and after a timed-out poll
                # the channel is new: this is the same silence as a deadline, not a port
                # that is closed.
                raise SourceTimeout(
                    f"{self.name}: ServerInfo {NO_ANSWER} {self._timeout_s:g}s "
                    "(connecting, no answer)") from None
            if code == grpc.StatusCode.UNAVAILABLE:
                raise SourceUnreachable(f"{self.name}: unreachable ({_details(e)})") from None
            raise SourceProtocolError(
                f"{self.name}: ServerInfo failed with {code.name if code else 'error'} "
                f"({_details(e)})"
            ) from None

    def poll(self) -> PollOutcome:
        started_at, t0 = self._clock(), self._perf()
        try:
            raw = self.fetch()
            tables = tuple(snapshots_from_response(raw, self.name, started_at))
        except SourceTimeout as e:
            # A frozen server can leave the channel wedged; start afresh next time.
            self.close()
            return PollOutcome(self.name, self.kind, started_at, self._perf() - t0, error=str(e),
                               memory=self._read_memory(started_at))
        except Exception as e:  # a failed poll is data, never a crash
            return PollOutcome(self.name, self.kind, started_at, self._perf() - t0, error=str(e),
                               memory=self._read_memory(started_at))
        return PollOutcome(self.name, self.kind, started_at, self._perf() - t0, tables=tables,
                           memory=self._read_memory(started_at))

    def _read_memory(self, at: float) -> MemorySnapshot | None:
        if self._memory is None:
            return None
        try:
            return self._memory.read(at)
        except Exception:  # the memory's read must never cost the server's poll
            return None

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._call = None


_FROZEN = "before receiving SETTINGS frame"
# gRPC core's words for a connect that did not complete in time (cut by the call's deadline,
# or by the channel's connect timeout): nothing refused it.
_CONNECT_CUT = ("handshaker shutdown", "connect() timed out")


def _details(error: grpc.RpcError) -> str:
    details = error.details() if hasattr(error, "details") else None
    return (details or str(error)).splitlines()[0][:200]
