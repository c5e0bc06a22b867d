"""Context window per model (design §4.5): overrides → litellm's max_input_tokens → built-in table → fallback."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

import runtime.models as models_module
from runtime.config import ModelsConfig
from runtime.models import BUILTIN_MODELS, ModelInfo, model_info, name_candidates


@pytest.fixture
def litellm() -> ModuleType:
    # Imported here, after `import runtime` (above) made litellm use its bundled model map offline.
    import litellm

    return litellm


@pytest.fixture
def without_litellm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend litellm knows no model, to exercise the built-in table and the fallback."""
    monkeypatch.setattr(models_module, "_litellm_limits", lambda name: None)


@pytest.fixture(autouse=True)
def fresh_lookups() -> Iterator[None]:
    models_module._litellm_limits.cache_clear()
    yield
    models_module._litellm_limits.cache_clear()


def test_name_candidates_strip_provider_prefixes() -> None:
    assert list(name_candidates("openrouter/anthropic/claude-sonnet-4")) == [
        "openrouter/anthropic/claude-sonnet-4",
        "anthropic/claude-sonnet-4",
        "claude-sonnet-4",
    ]
    assert list(name_candidates("gpt-4o")) == ["gpt-4o"]


def test_window_comes_from_litellms_max_input_tokens_not_get_max_tokens(litellm: ModuleType) -> None:
    info = model_info("gpt-4o")
    assert info.source == "litellm"
    assert info.context_window == litellm.get_model_info("gpt-4o")["max_input_tokens"]
    assert info.max_output_tokens == litellm.get_model_info("gpt-4o")["max_output_tokens"]
    # get_max_tokens answers with the output limit, which is far smaller than the window.
    assert info.context_window > litellm.get_max_tokens("gpt-4o")


def test_get_max_tokens_is_never_called(monkeypatch: pytest.MonkeyPatch, litellm: ModuleType) -> None:
    def forbidden(*args: object, **kwargs: object) -> int:
        raise AssertionError("litellm.get_max_tokens returns the output limit; do not use it")

    monkeypatch.setattr(litellm, "get_max_tokens", forbidden)
    for model in ("gpt-4o", "anthropic/claude-sonnet-4-5", "openrouter/openai/gpt-4o", "no-such-model"):
        assert model_info(model).context_window > 0


@pytest.mark.parametrize("model", ["openai/gpt-4o", "openrouter/openai/gpt-4o"])
def test_provider_prefixes_resolve_to_the_same_model(model: str) -> None:
    assert model_info(model) == model_info("gpt-4o")


def test_anthropic_models_through_litellm(litellm: ModuleType) -> None:
    expected = litellm.get_model_info("anthropic/claude-sonnet-4-5")["max_input_tokens"]
    assert model_info("anthropic/claude-sonnet-4-5") == ModelInfo(
        expected, litellm.get_model_info("anthropic/claude-sonnet-4-5")["max_output_tokens"], "litellm"
    )


def test_unmapped_model_does_not_print(capsys: pytest.CaptureFixture[str]) -> None:
    model_info("totally-unknown-model")
    model_info("openai/totally-unknown-model")
    assert capsys.readouterr().out == ""


def test_overrides_match_full_name_or_name_without_prefix() -> None:
    config = ModelsConfig(
        context_windows={"gpt-4o": 50_000, "openrouter/acme/big": 900_000},
        max_output_tokens={"gpt-4o": 2_000},
    )
    assert model_info("gpt-4o", config) == ModelInfo(50_000, 2_000, "override")
    assert model_info("openai/gpt-4o", config) == ModelInfo(50_000, 2_000, "override")
    assert model_info("openrouter/acme/big", config).context_window == 900_000
    # The override names a prefixed model; the bare name is a different model.
    assert model_info("big", config).source == "fallback"


def test_window_override_keeps_the_known_output_limit(litellm: ModuleType) -> None:
    info = model_info("gpt-4o", ModelsConfig(context_windows={"gpt-4o": 60_000}))
    assert info == ModelInfo(60_000, litellm.get_model_info("gpt-4o")["max_output_tokens"], "override")


@pytest.mark.usefixtures("without_litellm")
def test_builtin_table_covers_models_litellm_lacks() -> None:
    assert model_info("xai/grok-4-0709") == ModelInfo(*BUILTIN_MODELS["grok-4"], "builtin")
    assert model_info("openrouter/anthropic/claude-3.5-sonnet") == ModelInfo(
        *BUILTIN_MODELS["claude-3.5-sonnet"], "builtin"
    )
    # The longest matching name wins, and a prefix only matches up to a name boundary.
    assert model_info("gpt-4.1-mini").context_window == BUILTIN_MODELS["gpt-4.1"][0]
    assert model_info("gpt-4o-2024-08-06").context_window == BUILTIN_MODELS["gpt-4o"][0]
    assert model_info("gpt-4-0613").context_window == BUILTIN_MODELS["gpt-4"][0]
    assert model_info("gpt-4-turbo-preview").context_window == BUILTIN_MODELS["gpt-4-turbo"][0]
    assert model_info("gpt-45-experimental").source == "fallback"


@pytest.mark.usefixtures("without_litellm")
def test_overrides_beat_the_builtin_table() -> None:
    config = ModelsConfig(context_windows={"grok-4": 100_000})
    assert model_info("xai/grok-4", config).context_window == 100_000
    assert model_info("xai/grok-4", config).source == "override"


def test_fallback_for_unknown_models() -> None:
    assert model_info("agentcell-local") == ModelInfo(128_000, None, "fallback")
    assert model_info("openai/agentcell-local", ModelsConfig(fallback_context_window=32_000)) == ModelInfo(
        32_000, None, "fallback"
    )


def test_lookups_are_cached(monkeypatch: pytest.MonkeyPatch, litellm: ModuleType) -> None:
    calls: list[str] = []
    real = litellm.get_model_info

    def counting(model: str, *args: object, **kwargs: object) -> object:
        calls.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(litellm, "get_model_info", counting)
    first = model_info("gpt-4o")
    for _ in range(5):
        assert model_info("gpt-4o") == first
    assert calls == ["gpt-4o"]
