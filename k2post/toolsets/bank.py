"""A simulated bank: named accounts with balances in cents and a transaction history.

Amounts are dollars with at most two decimals; an account may not go below zero. Tools:
list_accounts, get_balance, transfer, pay, list_transactions. Templates: transfer and report
the new balance, pay a bill after covering the shortfall from savings, sweep everything above
$100 into savings and report the amount.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from k2post.toolsets.base import ToolError, Toolset, ToolsetState, tool_spec
from k2post.toolsets.checks import CallPattern, Checkpoint, Scenario, called, expect, ref_call

_ACCOUNT = {"type": "string", "minLength": 1, "description": "Account name, e.g. checking."}
_AMOUNT = {
    "type": "number",
    "minimum": 0.01,
    "maximum": 1000000,
    "description": "Dollars, at most 2 decimals.",
}
TODAY = "2025-03-03"


class Transaction(BaseModel):
    """One booked movement of money (negative = money out)."""

    id: str = Field(description="Transaction id, e.g. txn-4.")
    date: str = Field(description="YYYY-MM-DD.")
    account: str = Field(description="Account it is booked on.")
    amount_cents: int = Field(description="Signed amount in cents.")
    kind: Literal["deposit", "purchase", "transfer", "payment"] = Field(description="Kind.")
    description: str = Field("", description="Merchant, payee or memo.")


class BankState(ToolsetState):
    """Balances (cents) by account, the history and the id counter."""

    toolset: Literal["bank"] = "bank"
    accounts: dict[str, int] = Field(default_factory=dict, description="Account → balance in cents.")
    transactions: list[Transaction] = Field(default_factory=list, description="Oldest first.")
    next_id: int = Field(1, description="Number of the next transaction id.")
    today: str = Field(TODAY, description="Date of new transactions.")


def format_money(cents: int) -> str:
    """`$12.50` / `-$3.00`."""
    sign = "-" if cents < 0 else ""
    return f"{sign}${abs(cents) // 100}.{abs(cents) % 100:02d}"


def money_alternatives(cents: int) -> list[str]:
    """Ways to write an amount in an answer: 125.00, and $125 for whole dollars."""
    forms = [f"{cents // 100}.{cents % 100:02d}"]
    if cents % 100 == 0:
        forms.append(f"${cents // 100}")
    return forms


def to_cents(amount: float) -> int:
    """Cents of a dollar amount; more than two decimals is an error."""
    cents = round(amount * 100)
    if abs(cents - amount * 100) > 1e-6:
        raise ToolError(f"amount {amount} has more than two decimals")
    return cents


def _account(state: BankState, raw: str) -> str:
    """The state's name of account `raw` (case-insensitive)."""
    name = raw.strip().lower()
    if name not in state.accounts:
        raise ToolError(f"no account {raw!r} (accounts: {', '.join(state.accounts)})")
    return name


def _book(state: BankState, account: str, cents: int, kind: str, description: str) -> Transaction:
    """Apply and record a movement; returns the transaction."""
    if state.accounts[account] + cents < 0:
        have = format_money(state.accounts[account])
        raise ToolError(f"insufficient funds in {account} ({have} available)")
    state.accounts[account] += cents
    txn = Transaction(
        id=f"txn-{state.next_id}",
        date=state.today,
        account=account,
        amount_cents=cents,
        kind=kind,
        description=description,  # type: ignore[arg-type]
    )
    state.transactions.append(txn)
    state.next_id += 1
    return txn


class BankToolset(Toolset):
    """Tools over a BankState."""

    name: ClassVar[str] = "bank"
    description: ClassVar[str] = "a bank account"
    context: ClassVar[str] = "Today is Monday 2025-03-03. Amounts are in US dollars."
    state_cls: ClassVar[type[ToolsetState]] = BankState
    specs = (
        tool_spec("list_accounts", "List the accounts with their balances.", {}, []),
        tool_spec("get_balance", "Return the balance of an account.", {"account": _ACCOUNT}, ["account"]),
        tool_spec(
            "transfer",
            "Move money between two of the user's accounts.",
            {
                "from_account": _ACCOUNT,
                "to_account": _ACCOUNT,
                "amount": _AMOUNT,
                "memo": {"type": "string", "default": "", "description": "Optional note."},
            },
            ["from_account", "to_account", "amount"],
        ),
        tool_spec(
            "pay",
            "Pay a payee from an account.",
            {
                "account": _ACCOUNT,
                "payee": {"type": "string", "minLength": 1, "description": "Who is paid."},
                "amount": _AMOUNT,
            },
            ["account", "payee", "amount"],
        ),
        tool_spec(
            "list_transactions",
            "List an account's most recent transactions, newest first.",
            {
                "account": _ACCOUNT,
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 50,
                    "default": 10,
                    "description": "How many.",
                },
            },
            ["account"],
        ),
    )

    def canonical_arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {
            k: v.strip().lower() if k.endswith("account") and isinstance(v, str) else v for k, v in arguments.items()
        }

    def tool_list_accounts(self, state: BankState) -> str:
        return "\n".join(f"{name}: {format_money(cents)}" for name, cents in state.accounts.items())

    def tool_get_balance(self, state: BankState, account: str) -> str:
        name = _account(state, account)
        return f"{name}: {format_money(state.accounts[name])}"

    def tool_transfer(self, state: BankState, from_account: str, to_account: str, amount: float, memo: str) -> str:
        source, target, cents = (
            _account(state, from_account),
            _account(state, to_account),
            to_cents(amount),
        )
        if source == target:
            raise ToolError("from_account and to_account must differ")
        out = _book(state, source, -cents, "transfer", memo or f"to {target}")
        _book(state, target, cents, "transfer", memo or f"from {source}")
        return f"Transferred {format_money(cents)} from {source} to {target} ({out.id})"

    def tool_pay(self, state: BankState, account: str, payee: str, amount: float) -> str:
        name = _account(state, account)
        txn = _book(state, name, -to_cents(amount), "payment", payee.strip())
        return f"Paid {format_money(-txn.amount_cents)} to {txn.description} from {name} ({txn.id})"

    def tool_list_transactions(self, state: BankState, account: str, limit: float) -> str:
        name = _account(state, account)
        rows = [t for t in reversed(state.transactions) if t.account == name][: int(limit)]
        lines = [f"{t.id} | {t.date} | {format_money(t.amount_cents)} | {t.kind} | {t.description}" for t in rows]
        return "\n".join(lines) if lines else f"No transactions on {name}"


# --- task templates -----------------------------------------------------------------------

_MERCHANTS = (
    "Grocer Mart",
    "City Transit",
    "Coffee Corner",
    "BookNook",
    "FuelStop",
    "StreamFlix",
    "PharmaPlus",
)
_PAYEES = (
    "Acme Property Management",
    "City Water",
    "PowerGrid Electric",
    "FastNet Internet",
    "Dr. Lee Dental",
)


def _dollars(rng: random.Random, low: int, high: int) -> int:
    """A random amount in cents: whole dollars or with cents."""
    cents = rng.randint(low, high) * 100
    return cents + rng.choice((0, 0, rng.randint(1, 99)))


def _amount_text(cents: int) -> str:
    return str(cents // 100) if cents % 100 == 0 else f"{cents // 100}.{cents % 100:02d}"


def _bank(rng: random.Random, balances: dict[str, int]) -> BankState:
    """A state with these balances and a short past history of purchases."""
    state = BankState(seed=rng.randrange(2**31), accounts=dict(balances))
    for day in sorted(rng.sample(range(20, 29), 4)):
        account = rng.choice([name for name in balances if name != "savings"] or ["savings"])
        txn = Transaction(
            id=f"txn-{state.next_id}",
            date=f"2025-02-{day}",
            account=account,
            amount_cents=-_dollars(rng, 3, 80),
            kind="purchase",
            description=rng.choice(_MERCHANTS),
        )
        state.transactions.append(txn)
        state.next_id += 1
    return state


def _balances(rng: random.Random) -> dict[str, int]:
    balances = {"checking": _dollars(rng, 400, 3000), "savings": _dollars(rng, 1000, 9000)}
    if rng.random() < 0.5:
        balances["travel"] = _dollars(rng, 150, 900)
    return balances


def _balance_checked(account: str, before: CallPattern | None, after: CallPattern | None) -> Checkpoint:
    """get_balance on `account` (or list_accounts), ordered before / after a call."""
    order = f" before {before.tool}" if before else f" after {after.tool}" if after else ""
    return Checkpoint(
        id="checked_balance",
        description=f"get_balance on {account} or list_accounts{order}",
        calls=[called("get_balance", account=account), called("list_accounts")],
        before=before,
        after=after,
    )


def _transfer(source: str, target: str, cents: int) -> dict[str, Any]:
    return {"from_account": source, "to_account": target, "amount": cents / 100}


def transfer_and_report(rng: random.Random) -> Scenario:
    """Transfer between two accounts and report the destination's new balance."""
    balances = _balances(rng)
    source, target = rng.sample(sorted(balances), 2)
    cents = _dollars(rng, 5, min(300, balances[source] // 100 - 1))
    expected = {**balances, source: balances[source] - cents, target: balances[target] + cents}
    transfer = _transfer(source, target, cents)
    return Scenario(
        toolset="bank",
        template="bank_transfer_report",
        prompt=(
            f"Transfer ${_amount_text(cents)} from my {source} account to {target} "
            f"and tell me the new {target} balance."
        ),
        initial_state=_bank(rng, balances).model_dump(mode="json"),
        success=[expect(["accounts"], "equals", expected, "balances after the transfer")],
        checkpoints=[
            Checkpoint(id="transfer_amount", calls=[called("transfer", **transfer)]),
            _balance_checked(target, None, called("transfer", from_account=source, to_account=target)),
        ],
        answer=[money_alternatives(expected[target])],
        reference_turns=[
            [ref_call("transfer", **transfer)],
            [ref_call("get_balance", account=target)],
        ],
        reference_answer=f"Done. Your {target} balance is now {format_money(expected[target])}.",
    )


def cover_shortfall(rng: random.Random) -> Scenario:
    """Pay a bill larger than checking after moving exactly the shortfall from savings."""
    balances = {"checking": _dollars(rng, 40, 400), "savings": _dollars(rng, 2000, 9000)}
    bill, payee = balances["checking"] + _dollars(rng, 20, 600), rng.choice(_PAYEES)
    shortfall = bill - balances["checking"]
    expected = {"checking": 0, "savings": balances["savings"] - shortfall}
    move = _transfer("savings", "checking", shortfall)
    pay = {"account": "checking", "payee": payee, "amount": bill / 100}
    booked = {"account": "checking", "amount_cents": -bill, "kind": "payment", "description": payee}
    return Scenario(
        toolset="bank",
        template="bank_cover_shortfall",
        prompt=(
            f"Pay ${_amount_text(bill)} to {payee} from my checking account. If checking can't "
            "cover it, first move exactly the shortfall from savings into checking."
        ),
        initial_state=_bank(rng, balances).model_dump(mode="json"),
        success=[
            expect(["accounts"], "equals", expected, "balances after paying"),
            expect(["transactions"], "contains", booked, "the payment is booked"),
        ],
        checkpoints=[
            _balance_checked("checking", called("pay"), None),
            Checkpoint(id="shortfall_transfer", calls=[called("transfer", **move)]),
            Checkpoint(id="payment", calls=[called("pay", **pay)]),
        ],
        reference_turns=[
            [ref_call("get_balance", account="checking")],
            [ref_call("transfer", **move)],
            [ref_call("pay", **pay)],
        ],
        reference_answer=f"Moved {format_money(shortfall)} from savings and paid {payee}.",
    )


def sweep_to_savings(rng: random.Random) -> Scenario:
    """Leave $100 in an account, move the rest to savings, report the amount moved."""
    balances = _balances(rng)
    source = rng.choice(sorted(set(balances) - {"savings"}))
    moved = balances[source] - 10000
    expected = {**balances, source: 10000, "savings": balances["savings"] + moved}
    transfer = _transfer(source, "savings", moved)
    return Scenario(
        toolset="bank",
        template="bank_sweep",
        prompt=(f"Leave exactly $100 in my {source} account and move the rest to savings. How much did you move?"),
        initial_state=_bank(rng, balances).model_dump(mode="json"),
        success=[expect(["accounts"], "equals", expected, "balances after the sweep")],
        checkpoints=[
            _balance_checked(source, called("transfer"), None),
            Checkpoint(id="transfer_amount", calls=[called("transfer", **transfer)]),
        ],
        answer=[money_alternatives(moved)],
        reference_turns=[
            [ref_call("get_balance", account=source)],
            [ref_call("transfer", **transfer)],
        ],
        reference_answer=f"I moved {format_money(moved)} to savings; {source} now holds $100.00.",
    )


TEMPLATES = {
    "bank_transfer_report": transfer_and_report,
    "bank_cover_shortfall": cover_shortfall,
    "bank_sweep": sweep_to_savings,
}
