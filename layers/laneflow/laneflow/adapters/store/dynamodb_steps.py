"""The DynamoDB store's step items: what a step's attempts write lives on its step item
(attempt records, journal entries, prompt layers, a few spans), so each write of a step's
happy path is one conditional write of one item (see laneflow.adapters.store.dynamodb)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from laneflow.adapters.store.dynamodb_blobs import Blobs
from laneflow.adapters.store.dynamodb_expr import Expr, Update, fence_condition, fence_holds
from laneflow.adapters.store.dynamodb_items import (
    ATTEMPT_ATTR,
    ATTEMPT_FIELDS,
    ATTEMPTS_ON_STEP,
    CALL_INLINE_MAX,
    CALLS_ON_STEP,
    JOURNAL_ATTR,
    JOURNAL_ON_STEP,
    RECORD_FIELD,
    RUN_SK,
    SEQUENCE,
    STEP_ATTRS,
    STEPS_END,
    TIME_FIELDS,
    attempt_attr,
    attempt_sk,
    call_sk,
    encode,
    event_sk,
    item_size,
    journal_attr,
    key_of,
    layers_json,
    layers_of,
    live_pk,
    live_sk,
    moved_journal_sk,
    pack_time,
    pending_journal,
    pk_of,
    plain,
    record_of,
    set_step_field,
    span_of,
    span_text,
    step_attr,
    step_name,
    step_sk,
    tenant_run,
    time_of,
    to_attr,
    to_number,
    unpack_time,
)
from laneflow.adapters.store.dynamodb_spans import StepSpans
from laneflow.adapters.store.dynamodb_table import ConditionFailed, Table
from laneflow.adapters.store.encoding import dumps
from laneflow.adapters.store.primitives import AttemptWrite, Claim, Refused, StepState
from laneflow.adapters.store.rulebook_base import WRITE_TRIES
from laneflow.domain.errors import Conflict
from laneflow.domain.outline import GroupOutline, StepFacts, outline_of
from laneflow.domain.records import (
    Attempt,
    AttemptRef,
    AttemptStatus,
    Event,
    JournalEntry,
    JournalStatus,
    ModelCall,
    Step,
    StepStatus,
)

if TYPE_CHECKING:
    from laneflow.adapters.store.dynamodb_items import Item

# A fenced write's changes: given the Update, its conditions and the step item as a refused
# try found it (None at first), adds what it writes; returns the index entries it writes.
Build = Callable[[Update, list[str], dict[str, Any] | None], int]


class StepItems(StepSpans):
    """Reads and conditional writes of step items, over one table."""

    def __init__(self, table: Table) -> None:
        self.table = table

    # -- reading what a step item holds --------------------------------------------------------

    def state(self, tenant: str, run_id: str, index: int | None, op_id: str | None) -> StepState | None:
        """The rule book's `StepState` of a step item (found by `op_id` when index is None)."""
        if index is None:
            assert op_id is not None
            item = self.journal_step(tenant, run_id, op_id)
            if item is None:
                moved = self.moved_entry(tenant, run_id, op_id)
                if moved is None:
                    return None
                item = self.table.get(key_of(tenant, run_id, step_sk(moved.index)))
        else:
            item = self.table.get(key_of(tenant, run_id, step_sk(index)))
        if item is None:
            return None
        index = int(item["index"]["N"])
        entry = landed = None
        if op_id is not None:
            entry = self.entry_on(tenant, run_id, op_id, item)
            if entry is None and "jm" in item:
                entry = self.moved_entry(tenant, run_id, op_id)
            ns = [n for n, record in sorted(self.records(item).items()) if record.get("op", {}).get("S") == op_id]
            landed = self.record_attempt(run_id, index, ns[0], self.records(item)[ns[0]]) if ns else None
        return StepState(
            index=index,
            status=item["status"]["S"],
            attempts=int(to_number(item["attempts"]["N"])) if "attempts" in item else 0,
            last_n=int(item["last_n"]["N"]) if "last_n" in item else 0,
            running=int(item["live_n"]["N"]) if "live_n" in item else None,
            entry=entry,
            landed=landed,
            seen=item,
        )

    def attempts(self, tenant: str, run_id: str, index: int | None, n: int | None) -> list[Attempt] | None:
        """The attempts of a run, of a step, or one, wherever they are kept (None: no run,
        asked of the run item only when no step item was found)."""
        if n is not None:
            assert index is not None
            item = self.table.get(key_of(tenant, run_id, step_sk(index)))
            got = None if item is None else self.attempt_at(tenant, run_id, index, n, item)
            return [] if got is None else [got]
        pk = pk_of(tenant, run_id)
        if index is None:
            steps = self.table.query_range(pk, "S#", STEPS_END)
        else:
            item = self.table.get(key_of(tenant, run_id, step_sk(index)))
            steps = [item] if item is not None else []
        if not steps:
            head = self.table.get(key_of(tenant, run_id, RUN_SK))
            return None if head is None or "hidden" in head else []
        found: dict[tuple[int, int], Attempt] = {}
        # Attempts moved off their step (only a step that does not keep all of its numbers has any)
        if any(len(self.records(i)) < to_number(i["last_n"]["N"]) for i in steps if "last_n" in i):
            for moved in self.table.query_prefix(pk, "A#" if index is None else f"A#{index:08d}#"):
                attempt = self.attempt_of(moved)
                found[(attempt.index, attempt.n)] = attempt
        for item in steps:
            for attempt in self.attempts_on(item):
                found[(attempt.index, attempt.n)] = attempt
        return list(found.values())

    def running(self, items: list[dict[str, Any]]) -> list[tuple[str, Attempt]]:
        """(tenant, attempt) of the running attempts of live step items."""
        found = []
        for item in items:
            if "live_n" not in item:
                continue
            n = int(item["live_n"]["N"])
            record = record_of(item, n)
            if record is None or record.get("st", {}).get("S") != AttemptStatus.running.value:
                continue
            owner, run_id = tenant_run(item["pk"]["S"])
            found.append((owner, self.record_attempt(run_id, int(item["index"]["N"]), n, record)))
        return found

    def pending(self, items: list[dict[str, Any]]) -> list[JournalEntry]:
        """The pending journal entries of live step items."""
        entries = []
        for item in items:
            owner, run_id = tenant_run(item["pk"]["S"])
            for name, av in item.items():
                if JOURNAL_ATTR.fullmatch(name) and av["M"]["s"]["S"] == JournalStatus.pending.value:
                    entries.append(self.entry_on(owner, run_id, av["M"]["op"]["S"], item))
        return [e for e in entries if e is not None]

    def outline(self, tenant: str, run_id: str) -> list[GroupOutline]:
        """A run's group outline, counted here, of the step items' few small attributes (a
        projection: DynamoDB still reads each item, but only these cross the wire and are
        decoded)."""
        e = Expr()
        steps = f"{e.n('pk')} = {e.v(pk_of(tenant, run_id))} AND {e.n('sk')} BETWEEN {e.v('S#')} AND {e.v(STEPS_END)}"
        names = ("index", "group", "cycle", "status", "rescue_of", "optional", "cost_usd", "savings_usd")
        wanted = ", ".join(e.n(n) for n in names)
        items = self.table.query(KeyConditionExpression=steps, ProjectionExpression=wanted, **e.params())

        def number(item: dict[str, Any], name: str) -> float | None:
            value = item.get(name) or {}
            return float(value["N"]) if "N" in value else None

        return outline_of(
            StepFacts(
                index=int(number(i, "index") or 0),
                group=int(number(i, "group") or 0),
                cycle=int(number(i, "cycle") or 0),
                status=str((i.get("status") or {}).get("S", "")),
                rescue=number(i, "rescue_of") is not None,
                optional=bool((i.get("optional") or {}).get("BOOL", False)),
                cost_usd=number(i, "cost_usd") or 0.0,
                savings_usd=number(i, "savings_usd") or 0.0,
            )
            for i in items
        )

    # -- items of a step and its trace ----------------------------------------------------------

    def step_items(self, blobs: Blobs, tenant: str, run_id: str, step: Step) -> list[dict[str, Any]]:
        """A step record with whatever events, calls and layers it carries (the layers and
        the spans that fit in the step item, the rest as items)."""
        pk = {"pk": pk_of(tenant, run_id)}
        fields = {step_name(f): v for f in STEP_ATTRS if (v := step_attr(f, getattr(step, f))) is not None}
        head = {**pk, "sk": step_sk(step.index), **fields}
        if step.prompt_layers:
            head["layers"] = layers_json(step.prompt_layers)
        inline: dict[str, str] = {}
        spans: dict[str, dict[str, Any]] = {}
        for call in step.calls:
            body = span_text(call)
            if len(body.encode()) <= CALL_INLINE_MAX and (call.id in inline or len(inline) < CALLS_ON_STEP):
                inline[call.id] = body
                spans.pop(call.id, None)
            else:
                spans[call.id] = {**pk, "sk": call_sk(step.index, call.id), "n": call.n, "body": body}
                inline.pop(call.id, None)
        head["calls"] = inline  # always there, so a span can be set into it by path
        items = [blobs.item(head)]
        for event in step.events:
            items.append(
                blobs.item({**pk, "sk": event_sk(step.index, SEQUENCE.next()), **self.event_attrs(event, event.attempt)})
            )
        items += [blobs.item(span) for span in spans.values()]
        return items

    @staticmethod
    def event_attrs(event: Event, attempt: int | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {"t": event.t, "type": event.type, "text": event.text}
        if attempt is not None:
            attrs["attempt"] = attempt
        if event.data is not None:
            attrs["data"] = dumps(event.data)
        return attrs

    def with_trace(self, steps: dict[int, dict[str, Any]], raw: dict[int, dict[str, Any]], trace: list[dict[str, Any]]) -> None:
        """Attach events (in key order: the order written), calls (by n: the step item's,
        then span items of ids it does not hold) and prompt layers to step dicts."""
        events: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
        spans: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
        for item in trace:
            sk = item["sk"]["S"]
            index, kind = int(sk[2:10]), sk[11]
            if kind == "E":
                events[index].append(self.table.fields(item, ("t", "type", "text", "attempt", "data")))
            elif kind == "C":
                spans[index].append(item)
        for index, step in steps.items():
            item = raw[index]
            calls = {call_id: span_of(call_id, self.table.text(av)) for call_id, av in item.get("calls", {}).get("M", {}).items()}
            for span in spans[index]:
                call_id = span["sk"]["S"][len(call_sk(index, "")) :]
                if call_id not in calls:
                    calls[call_id] = span_of(call_id, self.table.text(span["body"]))
            step["events"] = events[index]
            step["calls"] = sorted(calls.values(), key=lambda c: (c.get("n", 1), c["id"]))
            step["prompt_layers"] = layers_of(self.table.text(item["layers"])) if "layers" in item else []

    # -- writes ---------------------------------------------------------------------------

    def claim(self, tenant: str, run_id: str, claim: Claim, seen: StepState) -> None:
        """The claim as one conditional update of the step item (see `RuleBookStore`)."""
        attempt, found, n = claim.attempt, seen.seen, claim.attempt.n
        sk = step_sk(attempt.index)
        key = key_of(tenant, run_id, sk)
        entry = claim.entry
        journal = journal_attr(entry.op_id) if entry is not None else None
        with self.table.blobs(tenant, run_id) as blobs:
            layers = None if claim.layers is None else layers_json(claim.layers)
            message = step_name("message")
            kept = blobs.attrs(sk, {"w": to_attr("worker", attempt.worker), "layers": layers, message: claim.message})
            u = Update().set("status", StepStatus.running.value).set("attempts", n).set("last_n", n).set("live_n", n)
            u.set_default("started_at", attempt.started_at)
            running = AttemptStatus.running.value
            started, resumed = pack_time(attempt.started_at), pack_time(attempt.resumed_at)
            record = plain(t=attempt.token, s=started, r=resumed, st=running, w=kept["w"], op=attempt.op_id)
            u.set(attempt_attr(n), record)
            if claim.layers is not None:
                u.set("layers", kept["layers"])
            if claim.message is not None:
                u.set(message, kept[message])
            # The step's live entry: made by journal_begin (then this leaves it as it is) or here.
            u.set("vpk", live_pk(tenant, "STEP")).set("vsk", live_sk(run_id, attempt.index))
            last_n = to_number(found["last_n"]["N"]) if "last_n" in found else None
            attempts = to_number(found["attempts"]["N"]) if "attempts" in found else 0
            condition = [u.eq("status", seen.status), u.absent("live_n"), u.eq("attempts", attempts), u.eq("last_n", last_n)]
            if entry is not None and journal is not None:
                if claim.created:  # no journal_begin: the claim makes its entry
                    condition += [u.absent(journal), u.eq("jm", to_number(found["jm"]["N"]) if "jm" in found else None)]
                else:  # pending: completed now, no longer counted as pending
                    condition.append(u.eq((journal, "s"), JournalStatus.pending.value))
                    u.add("jp", -1)
                u.set(
                    journal, {"s": JournalStatus.completed.value, "n": n, "c": pack_time(entry.created_at), "x": entry.expires_at}
                )
            self._keep_step_small(tenant, run_id, attempt.index, found, u, journal)
            try:
                self.table.update(
                    key,
                    u,
                    " AND ".join(condition),
                    returns="ALL_NEW",
                    size=item_size(found),
                    indexes=0 if "vpk" in found else 1,
                    blobs=blobs,
                )
            except ConditionFailed:
                raise Refused() from None

    def begin_entry(self, entry: JournalEntry, seen: StepState | None) -> None:
        """A pending entry on its step item, if the op_id has none (and the step moved off as
        many entries as `seen` says: none when not given)."""
        journal = journal_attr(entry.op_id)
        moved = to_number(seen.seen["jm"]["N"]) if seen is not None and "jm" in seen.seen else None
        began = {"s": entry.status.value, "op": entry.op_id, "c": pack_time(entry.created_at), "x": entry.expires_at}
        u = Update().set(journal, began)
        u.add("jp", 1).set("vpk", live_pk(entry.tenant, "STEP")).set("vsk", live_sk(entry.run_id, entry.index))
        condition = " AND ".join([u.exists("pk"), u.absent(journal), u.eq("jm", moved)])
        try:
            # The step enters the live index unless it is there already (an attempt runs, or
            # another entry is pending): setting the same key writes no index entry.
            self.table.update(
                key_of(entry.tenant, entry.run_id, step_sk(entry.index)),
                u,
                condition,
                returns="ALL_NEW",
                indexes=lambda new: int("live_n" not in new and pending_journal(new) == 1),
            )
        except ConditionFailed:
            raise Refused() from None

    def settle_entry(self, entry: JournalEntry, seen: StepState) -> None:
        """A pending entry settled, if it is still pending on the step item as seen."""
        item = seen.seen
        journal = journal_attr(entry.op_id)
        settled: dict[str, Any] = {"s": entry.status.value, "c": pack_time(entry.created_at), "x": entry.expires_at}
        if entry.attempt is not None:
            settled["n"] = entry.attempt
        u = Update().set(journal, settled).add("jp", -1)
        live = "live_n" in item
        condition = [u.eq((journal, "s"), JournalStatus.pending.value), u.eq("jp", pending_journal(item))]
        condition.append(u.exists("live_n") if live else u.absent("live_n"))
        leaves = not live and pending_journal(item) <= 1  # the last live thing of the step
        if leaves:
            u.remove("vpk").remove("vsk")
        try:
            self.table.update(
                {"pk": item["pk"], "sk": item["sk"]},
                u,
                " AND ".join(condition),
                returns="ALL_NEW",
                size=item_size(item),
                indexes=int(leaves),
            )
        except ConditionFailed:
            raise Refused() from None

    def write_attempt(self, ref: AttemptRef, write: AttemptWrite) -> None:
        """`write` as one fenced write of the step item (a transaction when spans need items)."""
        sk = step_sk(ref.index)
        with self.table.blobs(ref.tenant, ref.run_id) as blobs:
            changes = blobs.attrs(sk, {step_name(f): step_attr(f, v) for f, v in write.step.items()})
            why = blobs.attrs(sk, {"why": write.reason})["why"]
            layers = None if write.layers is None else blobs.attrs(sk, {"layers": layers_json(write.layers)})["layers"]
            kind = None if write.reason_kind is None else write.reason_kind.value

            def build(u: Update, condition: list[str], found: dict[str, Any] | None) -> int:
                record = attempt_attr(ref.n)
                if write.heartbeat_at is not None:
                    u.set((record, "hb"), pack_time(write.heartbeat_at))
                if layers is not None:
                    u.set("layers", layers)
                for field in write.step:
                    set_step_field(u, field, changes[step_name(field)])
                if write.status is None:
                    return 0
                u.set((record, "st"), write.status.value).set((record, "e"), pack_time(write.ended_at))
                if why is not None:
                    u.set((record, "why"), why)
                if kind is not None:
                    u.set((record, "k"), kind)
                u.remove("live_n")
                # The step leaves the live index with its attempt, unless a journal entry is pending.
                if found is None or pending_journal(found) < 1:
                    u.remove("vpk").remove("vsk").remove("jp")
                    condition.append(f"({u.absent('jp')} OR {u.n('jp')} < {u.v(1)})")
                    return 1
                condition.append(f"{u.n('jp')} >= {u.v(1)}")
                return 0

            self._attempt_write(ref, blobs, build, calls=write.calls)

    # -- helpers --------------------------------------------------------------------------

    def attempt_of(self, item: dict[str, Any]) -> Attempt:
        return Attempt.model_validate(self.table.fields(item, ATTEMPT_FIELDS))

    def record_attempt(self, run_id: str, index: int, n: int, record: Mapping[str, Any]) -> Attempt:
        fields = {field: self.table.text(av) for short, av in record.items() if (field := RECORD_FIELD.get(short))}
        fields = {field: unpack_time(value) if field in TIME_FIELDS else value for field, value in fields.items()}
        return Attempt(run_id=run_id, index=index, n=n, **fields)

    def records(self, item: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """The attempt records a step item keeps, by n."""
        return {int(m.group(1)): av["M"] for name, av in item.items() if (m := ATTEMPT_ATTR.fullmatch(name))}

    def attempts_on(self, item: dict[str, Any]) -> list[Attempt]:
        _, run_id = tenant_run(item["pk"]["S"])
        index = int(item["index"]["N"])
        return [self.record_attempt(run_id, index, n, record) for n, record in sorted(self.records(item).items())]

    def attempt_at(self, tenant: str, run_id: str, index: int, n: int, item: dict[str, Any] | None = None) -> Attempt | None:
        """Attempt n: from its step item (read here unless given) or, moved, its own item."""
        if item is None:
            item = self.table.get(key_of(tenant, run_id, step_sk(index)))
        record = record_of(item, n)
        if record is not None:
            return self.record_attempt(run_id, index, n, record)
        moved = self.table.get(key_of(tenant, run_id, attempt_sk(index, n)))
        return None if moved is None else self.attempt_of(moved)

    def entry_on(self, tenant: str, run_id: str, op_id: str, item: dict[str, Any]) -> JournalEntry | None:
        """The journal entry of `op_id` a step item keeps, if it does."""
        av = item.get(journal_attr(op_id))
        if av is None:
            return None
        m, index = av["M"], int(item["index"]["N"])
        entry = JournalEntry(
            tenant=tenant,
            run_id=run_id,
            op_id=op_id,
            index=index,
            status=m["s"]["S"],
            created_at=time_of(m["c"]) or "",
            expires_at=int(m["x"]["N"]),
        )
        if entry.status == JournalStatus.completed:
            got = self.attempt_at(tenant, run_id, index, int(m["n"]["N"]), item)
            if got is not None:
                identity = {"attempt": got.n, "token": got.token, "started_at": got.started_at, "resumed_at": got.resumed_at}
                entry = entry.model_copy(update=identity)
        return entry

    def moved_entry(self, tenant: str, run_id: str, op_id: str) -> JournalEntry | None:
        """The journal entry of `op_id` moved off its step, if it was."""
        item = self.table.get(key_of(tenant, run_id, moved_journal_sk(op_id)))
        if item is None:
            return None
        fields = self.table.fields(item, ("index", "status", "attempt", "created_at", "expires_at"))
        entry = JournalEntry(tenant=tenant, run_id=run_id, op_id=op_id, **fields)
        if entry.attempt is not None:
            got = self.attempt_at(tenant, run_id, entry.index, entry.attempt)
            if got is not None:
                entry = entry.model_copy(update={"token": got.token, "started_at": got.started_at, "resumed_at": got.resumed_at})
        return entry

    def journal_step(self, tenant: str, run_id: str, op_id: str) -> Item | None:
        """The step item keeping `op_id`'s journal entry: a Query of the run's steps, filtered
        (the journal is not told which step an op_id names)."""
        e = Expr()
        items = self.table.query(
            KeyConditionExpression=f"{e.n('pk')} = {e.v(pk_of(tenant, run_id))} AND {e.n('sk')} BETWEEN {e.v('S#')} AND {e.v(STEPS_END)}",
            FilterExpression=e.exists(journal_attr(op_id)),
            **e.params(),
        )
        return items[0] if items else None

    def _keep_step_small(
        self, tenant: str, run_id: str, index: int, found: dict[str, Any], u: Update, journal: str | None
    ) -> None:
        """Before a claim adds an attempt record (and a journal entry) to a step item: copy
        the oldest records and settled entries past what a step keeps to items of their own
        (they never change again, so a copy left by a refused claim is never stale) and
        remove them in the claim; drop settled entries past their expiry, as TTL would."""
        pk = pk_of(tenant, run_id)
        records = self.records(found)
        for n in sorted(records)[: max(0, len(records) + 1 - ATTEMPTS_ON_STEP)]:
            moved = encode({"pk": pk, "sk": attempt_sk(index, n), "run_id": run_id, "index": index, "n": n})
            moved.update({RECORD_FIELD[short]: av for short, av in records[n].items() if short in RECORD_FIELD})
            self.table.put(moved)
            u.remove(attempt_attr(n))
        now = int(time.time())
        settled = []
        for name, av in found.items():
            if not JOURNAL_ATTR.fullmatch(name) or name == journal or av["M"]["s"]["S"] == JournalStatus.pending.value:
                continue
            if int(av["M"]["x"]["N"]) < now:
                u.remove(name)
            else:
                settled.append((time_of(av["M"]["c"]) or "", name, av["M"]))
        moving = sorted(settled)[: max(0, len(settled) - (JOURNAL_ON_STEP - (journal is not None)))]
        for _, name, m in moving:
            moved = encode({"pk": pk, "sk": "J#" + name[1:], "index": index})
            moved.update(status=m["s"], created_at=m["c"], expires_at=m["x"])
            if "n" in m:
                moved["attempt"] = m["n"]
            self.table.put(moved)
            u.remove(name)
        if moving:
            u.add("jm", len(moving))

    def _attempt_write(
        self,
        ref: AttemptRef,
        blobs: Blobs,
        build: Build,
        *,
        calls: list[ModelCall] | None = None,
    ) -> None:
        """One fenced write to `ref`'s step item. `build` adds the write's changes and
        conditions for the item as a refused try found it (None at first: the cheap form) and
        returns the index entries it writes. Spans go into the step item while it has room,
        else to items of their own, which make it a transaction. A refusal that found the
        attempt gone is `Refused` with what it found; one that found it running is tried
        again in the form the item calls for."""
        key = key_of(ref.tenant, ref.run_id, step_sk(ref.index))
        spans = self._span_bodies(blobs, ref, calls or [])
        found: dict[str, Any] | None = None
        for _ in range(WRITE_TRIES):
            u = Update()
            condition = [fence_condition(u, ref)]
            indexes = build(u, condition, found)
            puts = self._place_spans(ref, u, condition, spans, found)
            size = item_size(found) if found is not None else 0
            try:
                if not puts:
                    self.table.update(key, u, " AND ".join(condition), returns="ALL_NEW", indexes=indexes, blobs=blobs, size=size)
                else:
                    self._fenced_transact(ref, key, u, " AND ".join(condition), puts, indexes, blobs, size)
                return
            except ConditionFailed as refused:
                found = refused.found(0) or self.table.get(key)
                if not fence_holds(found, ref):
                    raise Refused(self.fenced(ref, found)) from None
        raise Conflict(f"step {ref.index} of run {ref.run_id!r} kept changing while attempt {ref.n} wrote to it; try again")
