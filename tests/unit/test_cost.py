"""Request cost: prices in the token-cost policies, the counters' scope, the cost metric's accounts."""

from __future__ import annotations

from collections import Counter

import pytest

from scheduler_svc.app.settings import config_from_dict
from scheduler_svc.config import ConfigError
from scheduler_svc.core.clock import FakeClock
from scheduler_svc.policies import FAIRNESS_POLICIES, Fairness, WeightResolver
from scheduler_svc.policies.cost import CostAccounts, CounterScope, LocalCounters, Prices
from tests.unit import prompt_share_policy
from tests.unit.test_fairness_conformance import Harness


def _vtc(prices: Prices | None = None, scope: CounterScope | None = None) -> Fairness:
    params = {"vtc_return_grace_seconds": 0}  # serial serving: nobody is about to return
    policy = FAIRNESS_POLICIES.create("vtc", WeightResolver(), FakeClock(), params=params)
    if prices is not None or scope is not None:
        scope = scope or CounterScope()
        policy.account.use_costing(
            prices or Prices(), scope.counters("interactive", "user"), scope.counters("interactive", "group")
        )
    return policy


def test_accounts_name_configured_users_and_prefixes_and_sum_the_rest_as_other() -> None:
    accounts = CostAccounts({"alice": "alice", "team-*": "team", "team-red-*": "red"})
    assert accounts.label("alice") == "alice"
    assert accounts.label("team-blue-1") == "team"
    assert accounts.label("team-red-1") == "red"  # the longest prefix wins
    assert accounts.label("alice2") == accounts.label("mallory") == "other"
    assert accounts.labels() == {"alice", "team", "red", "other"}


@pytest.mark.parametrize(
    "scheduling",
    [{"fairness_scope": "planet"}, {"cost_accounts": {"a*b": "x"}}, {"cost_accounts": {"*": "all"}}],
)
def test_bad_scope_or_account_pattern_is_a_config_error(scheduling: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        config_from_dict({"scheduling": scheduling, "models": [{"name": "m", "backends": [{"name": "b"}]}]})


@pytest.mark.parametrize("price", [-1.0, float("nan"), 1e7])
def test_a_price_out_of_range_is_a_config_error(price: float) -> None:
    with pytest.raises(ConfigError, match="token_cost"):
        config_from_dict({"models": [{"name": "m", "input_token_cost": price, "backends": [{"name": "b"}]}]})


@pytest.mark.parametrize("fairness", ["vtc", "vtc_basic", "weighted_round_robin", "round_robin", "test_prompt_share"])
def test_a_model_whose_every_token_is_free_is_refused_where_the_policy_would_charge_nothing(fairness: str) -> None:
    """At prices of 0 a token-cost policy's counters stand still: weights do nothing and whoever is first
    filed is served on and on. The file is refused for those policies; the request-count ones count anyway,
    and one price above 0 is enough for each policy that reads it."""

    def config(input_cost: float, output_cost: float) -> None:
        model = {"name": "m", "input_token_cost": input_cost, "output_token_cost": output_cost}
        config_from_dict({"scheduling": {"fairness": fairness}, "models": [{**model, "backends": [{"name": "b"}]}]})

    with prompt_share_policy.registered():
        config(0.001, 0.0)  # the prompt counts everywhere
        if fairness.startswith("vtc"):
            config(0.0, 0.001)
        if fairness in ("vtc", "vtc_basic", "test_prompt_share"):
            with pytest.raises(ConfigError, match=r"models\[m\]: at input_token_cost = 0 and output_token_cost = 0"):
                config(0.0, 0.0)
        else:
            config(0.0, 0.0)
        if fairness == "test_prompt_share":
            with pytest.raises(ConfigError, match="charges nothing"):
                config(0.0, 1.0)  # it reads the input price alone


def _serve(h: Harness, rounds: int) -> Counter[str]:
    return Counter(h.serve().user for _ in range(rounds))


def test_default_prices_leave_vtc_exactly_as_it_was_and_prices_scale_the_counters() -> None:
    plain, priced_1, priced_3 = Harness(_vtc()), Harness(_vtc(Prices(1, 1))), Harness(_vtc(Prices(3, 3)))
    for h in (plain, priced_1, priced_3):
        h.add("a", 30, max_tokens=20)
        h.add("b", 30, max_tokens=7)
    orders = [[h.serve().request_id for _ in range(40)] for h in (plain, priced_1, priced_3)]
    assert orders[0] == orders[1] == orders[2]  # one model: a uniform price changes no decision
    assert plain.policy.account.counters() == priced_1.policy.account.counters()
    for user, value in plain.policy.account.counters().items():
        assert priced_3.policy.account.counters()[user] == pytest.approx(3 * value)


def test_an_output_price_weighs_generated_tokens_against_prompts() -> None:
    """Prompt-heavy against answer-heavy: with generated tokens priced 10x, the answer-heavy user is the
    expensive one and gets fewer requests."""
    h = Harness(_vtc(Prices(input=1, output=10)))
    h.add("prompts", 60, max_tokens=1)
    h.add("answers", 60, max_tokens=4)
    for _ in range(60):
        user = h.policy.select(h.band.flow_views)
        assert user is not None
        request = h.band.flows[user].head()
        h.queues.remove(request.request_id)
        h.policy.account.on_dispatched(request)
        h.policy.account.on_generated(request, request.max_tokens)
        h.policy.account.on_finished(request, request.max_tokens)
    counters = h.policy.account.counters()
    assert counters["prompts"] == pytest.approx(counters["answers"], rel=0.15)


def test_global_scope_repays_heavy_use_of_a_dear_model_on_a_cheap_one() -> None:
    """`a` is alone on the dear model (price 10) and shares the cheap one (price 1) with `b`. Global scope:
    `b` gets nearly all of the cheap model, since `a`'s spend is shared; model scope: half each."""

    def cheap_shares(scope: str) -> Counter[str]:
        counters = CounterScope(scope)
        dear, cheap = Harness(_vtc(Prices(10, 10), counters)), Harness(_vtc(Prices(1, 1), counters))
        dear.add("a", 200, max_tokens=10)
        cheap.add("a", 200, max_tokens=10)
        cheap.add("b", 200, max_tokens=10)
        served: Counter[str] = Counter()
        for _ in range(100):
            dear.serve()
            served[cheap.serve().user] += 1
        return served

    assert cheap_shares("model")["b"] == 50
    assert cheap_shares("global")["b"] >= 95


def test_global_scope_joining_a_second_model_neither_sheds_debt_nor_adds_any() -> None:
    counters = CounterScope("global")
    first, second = Harness(_vtc(scope=counters)), Harness(_vtc(scope=counters))
    first.add("a", 5, max_tokens=50)  # `a` alone on the first model runs up a debt of 5 x (1 + 100)
    _serve(first, 5)
    second.add("b", 20, max_tokens=10)
    _serve(second, 2)  # b: 2 x 21 on the second model
    before_first = first.policy.account.counters()["a"]
    second.add("a", 20, max_tokens=10)  # `a` joins the second model: not lifted (its spend is above b's)
    assert second.policy.account.counters()["a"] == pytest.approx(before_first)  # its debt came along
    assert first.policy.account.counters()["a"] == pytest.approx(before_first)  # and joining cost it nothing there
    served = _serve(second, 22)
    assert served == Counter({"b": 18, "a": 4})  # all of b first: it is still below a's spend


def test_global_scope_lifts_a_returning_user_only_in_the_band_it_returns_to() -> None:
    counters = CounterScope("global")
    first, second = Harness(_vtc(scope=counters)), Harness(_vtc(scope=counters))
    first.add("a", 2, max_tokens=10)
    second.add("b", 30, max_tokens=10)
    _serve(second, 10)  # b's spend: 10 x 21 on the second model
    _serve(first, 1)  # a's: 21
    second.add("a", 10, max_tokens=10)  # lifted to b's counter there, so it does not take 9 turns in a row
    assert _serve(second, 10)["a"] <= 6
    assert first.policy.account.counters()["a"] == pytest.approx(21.0 + 10 * 21.0 / 2, rel=0.3)  # its spend, no lift


def test_shared_spend_goes_with_the_last_band_that_tracks_the_user() -> None:
    scope = CounterScope("global")
    one, two = scope.counters("interactive", "user"), scope.counters("interactive", "user")
    one.charge("a", 5.0)
    two.lift("a", 3.0)
    assert two.value("a") == 5.0
    one.forget("a")
    assert two.value("a") == 5.0
    two.forget("a")
    assert one.value("a") == 0.0 and "a" not in one
    assert isinstance(CounterScope("model").counters("interactive", "user"), LocalCounters)


def test_a_closed_band_lets_go_of_the_shared_spend_and_hears_no_more_charges() -> None:
    """A band whose class or model left the configuration closes its counters: the keys it held go (the
    spend stays while another band holds them) and other bands' charges no longer reach it."""
    scope = CounterScope("global")
    gone, kept = scope.counters("interactive", "user"), scope.counters("interactive", "user")
    heard: list[str] = []
    gone.watch(heard.append)
    kept.charge("a", 5.0)
    assert heard == ["a"]
    gone.charge("b", 2.0)  # held by the closing band alone
    gone.lift("a", 1.0)
    gone.close()
    assert gone.keys() == set()
    assert kept.value("a") == 5.0, "a key another band holds keeps its spend"
    kept.lift("b", 0.0)
    assert kept.value("b") == 0.0, "a key only the closed band held left with it"
    kept.charge("a", 1.0)
    assert heard == ["a"], "a closed band hears no more charges"
