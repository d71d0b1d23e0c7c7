"""The DynamoDB store's handoffs, warm gates and inboxes (peers, ask): their primitives over
`H#`, `G#`/`GT#`, `N#` and `O#` items (see laneflow.adapters.store.dynamodb for the layout).
Who passes a gate and who is handed back is laneflow.domain.gate's to say; this keeps the
rendezvous exact with conditional requests, no transaction."""

from __future__ import annotations

import json
from typing import Any

from laneflow.adapters.store.dynamodb_expr import Expr, Update
from laneflow.adapters.store.dynamodb_items import (
    NOTE_PREFIX,
    OBSERVED_PREFIX,
    SEQUENCE,
    digest,
    encode,
    gate_token_prefix,
    item_size,
    key_of,
    live_pk,
    pk_of,
    write_units,
)
from laneflow.adapters.store.dynamodb_steps import StepItems
from laneflow.adapters.store.dynamodb_table import ConditionFailed, Table
from laneflow.adapters.store.primitives import Refused
from laneflow.domain.gate import GateClaim, GatePass, GateWaiter, lets_pass, releases
from laneflow.domain.inbox import Note, QuestionStatus
from laneflow.domain.records import AttemptRef, utcnow


class DynamoGatesAndInboxes:
    """The primitives of handoffs, gates and inboxes, over the store's table and step items."""

    _table: Table
    _items: StepItems

    def _read_handoff(self, tenant: str, run_id: str, key: str) -> str | None:
        item = self._table.get(key_of(tenant, run_id, f"H#{key}"))
        return None if item is None else self._table.text(item["text"])

    def _write_handoff(self, tenant: str, run_id: str, key: str, text: str) -> None:
        with self._table.blobs(tenant, run_id) as blobs:
            self._table.put(encode(blobs.item({"pk": pk_of(tenant, run_id), "sk": f"H#{key}", "text": text})))

    def _gate_wait(self, tenant: str, run_id: str, key: str, waiter: GateWaiter) -> GatePass | None:
        # The rendezvous without a transaction. Each waiting token is an item of its own (a
        # lane may have hundreds of siblings, and a callback token is ~1 KB). A sibling keeps
        # its token, then looks at the gate (strongly consistent reads throughout); the lead
        # marks the gate open (or its end), then takes the tokens kept. A token is handed back
        # by whoever deletes it (a conditional delete), so exactly once: a sibling that finds
        # the gate opened after it kept its token takes it back itself unless the lead did.
        gate_key = key_of(tenant, run_id, f"G#{key}")
        gate = self._table.get(gate_key)
        if _gate_passes(gate, waiter):
            return _gate_pass(gate)  # the lead's reply has begun (or it ended): nothing to keep
        attrs: dict[str, Any] = {
            "pk": pk_of(tenant, run_id),
            "sk": gate_token_prefix(key) + digest(waiter.token),
            "token": waiter.token,
        }
        attrs.update({"index": waiter.index, "until": "ended" if waiter.until_lead_ends else None})
        item = encode(attrs)
        self._table.put(item)
        gate = self._table.get(gate_key)
        if not _gate_passes(gate, waiter):
            return None  # kept: the lead will complete it
        if self._table.delete({"pk": item["pk"], "sk": item["sk"]}) is None:
            return None  # the lead took it first: the lead completes it
        self._table.count(write=write_units(item_size(item)))
        return _gate_pass(gate)

    def _gate_open(self, tenant: str, run_id: str, key: str, *, lead_ended: bool, note: str | None) -> list[GateWaiter]:
        u = Update().set_default("opened_at", utcnow())
        if lead_ended:
            u.set_default("ended_at", utcnow())
        if note:
            u.set_default("note", note)
        self._table.update(key_of(tenant, run_id, f"G#{key}"), u)
        # Every token put before this write is now visible; each is handed back by whoever
        # deletes it (a second opener racing this one gets the others, never the same).
        handed = []
        for item in self._table.query_prefix(pk_of(tenant, run_id), gate_token_prefix(key)):
            waiter = GateWaiter(
                token=item["token"]["S"],
                index=int(item["index"]["N"]) if "index" in item else None,
                until_lead_ends="until" in item,
            )
            if not releases(waiter, lead_ended=lead_ended):
                continue  # the reserve waits for the lead's end
            reply = self._table.delete({"pk": item["pk"], "sk": item["sk"]}, returns="ALL_OLD")
            if reply is None:
                continue
            self._table.count(write=write_units(item_size(item)))
            if "Attributes" in reply:
                handed.append(waiter)
        return handed

    def _gate_claim(self, tenant: str, run_id: str, key: str) -> GateClaim:
        gate_key = key_of(tenant, run_id, f"G#{key}")
        gate = self._table.get(gate_key)
        if gate is None:
            try:
                self._table.put({**gate_key, **encode({"made": utcnow()})}, "attribute_not_exists(pk)")
                return "lead"
            except ConditionFailed:
                gate = self._table.get(gate_key)
        return "open" if gate is not None and ("opened_at" in gate or "ended_at" in gate) else "wait"

    # Notes and observations sort before `RUN`, so no read of a run's record reads them.

    @staticmethod
    def _note_item(tenant: str, note: Note) -> dict[str, Any]:
        item: dict[str, Any] = {
            "pk": pk_of(tenant, note.run_id),
            "sk": NOTE_PREFIX + note.id,
            "to": note.to_index,
            "st": note.status.value if note.status else None,
            "body": note.model_dump_json(),
        }
        if note.status == QuestionStatus.open:  # an open question is live: `open_questions` finds it
            item["vpk"], item["vsk"] = live_pk(tenant, "ASK"), f"{note.at}#{note.id}"
        return encode(item)

    def _read_notes(self, tenant: str, run_id: str, note_id: str | None = None) -> list[Note]:
        if note_id is None:
            items = self._table.query_prefix(pk_of(tenant, run_id), NOTE_PREFIX)
        else:
            item = self._table.get(key_of(tenant, run_id, NOTE_PREFIX + note_id))
            items = [] if item is None else [item]
        return [Note.model_validate_json(i["body"]["S"]) for i in items]

    def _read_observed(self, tenant: str, run_id: str, index: int) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for item in self._table.query_prefix(pk_of(tenant, run_id), f"{OBSERVED_PREFIX}{index:08d}#"):
            out.setdefault(int(item["n"]["N"]), []).extend(json.loads(item["ids"]["S"]))
        return out

    def _open_questions(self, tenant: str | None) -> list[tuple[str, Note]]:
        found = []
        for item in self._table.live("ASK", tenant):
            owner = item["pk"]["S"].split("#")[1]
            found.append((owner, Note.model_validate_json(item["body"]["S"])))
        return found

    def _write_note(self, tenant: str, note: Note, *, replaces_open: bool) -> None:
        e = Expr()
        item = self._note_item(tenant, note)
        if replaces_open:  # the question leaves the live index unless it stays open
            condition, indexes = f"{e.exists('pk')} AND {e.eq('st', QuestionStatus.open.value)}", 1
        else:
            condition, indexes = e.absent("pk"), int("vpk" in item)
        try:
            self._table.put(item, condition, e, indexes=indexes)
        except ConditionFailed as refused:
            found = refused.found(0) if replaces_open else None
            raise Refused(None if found is None else Note.model_validate_json(found["body"]["S"])) from None

    @staticmethod
    def _observed_item(ref: AttemptRef, ids: list[str]) -> dict[str, Any]:
        """The item of the ids attempt `ref` observed (its fence is the caller's)."""
        sk = f"{OBSERVED_PREFIX}{ref.index:08d}#{ref.n:06d}#{SEQUENCE.next()}"
        return encode({"pk": pk_of(ref.tenant, ref.run_id), "sk": sk, "n": ref.n, "ids": json.dumps(ids)})


def _gate_passes(gate: dict[str, Any] | None, waiter: GateWaiter) -> bool:
    """Whether a gate item lets this waiter start: opened, or for the reserve, the lead ended."""
    return gate is not None and lets_pass(waiter, opened="opened_at" in gate, lead_ended="ended_at" in gate)


def _gate_pass(gate: dict[str, Any] | None) -> GatePass:
    return GatePass(note=gate["note"]["S"] if gate and "note" in gate else None)
