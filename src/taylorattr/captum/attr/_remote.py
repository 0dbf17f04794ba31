"""Captum's remote language-model attribution: ``RemoteLLMProvider``, ``VLLMProvider``
and ``RemoteLLMAttribution``.

A model served elsewhere (the user's own vLLM or OpenAI-compatible server) gives the
log-probabilities ``log p(t_k | prompt, t_<k)`` of a target text after a prompt
(``provider.get_logprobs``) and generates answers (``provider.generate``);
``RemoteLLMAttribution`` runs the perturbation methods of
:class:`~taylorattr.captum.attr.LLMAttribution` on them, one request per distinct
perturbed prompt. taylorattr itself makes no network call: the provider does, to the
address the user gives (``VLLMProvider`` through the ``openai`` client).
"""
from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod

import torch

from ._llm import DEFAULT_GEN_ARGS, LLMAttribution

__all__ = ["ProviderError", "RemoteLLMAttribution", "RemoteLLMProvider", "VLLMProvider"]

logger = logging.getLogger(__name__)


class ProviderError(Exception):
    """An unexpected failure of the provider's API call (Captum raises ``Exception``)."""


class RemoteLLMProvider(ABC):
    """A served model that gives log-probabilities: ``generate(prompt, **gen_args) -> str``
    and ``get_logprobs(input_prompt, target_str, tokenizer) -> list[float]`` (one per token
    of ``target_str``)."""

    api_url: str

    @abstractmethod
    def generate(self, prompt: str, **gen_args) -> str: ...

    @abstractmethod
    def get_logprobs(self, input_prompt: str, target_str: str, tokenizer=None) -> list: ...


class VLLMProvider(RemoteLLMProvider):
    """A vLLM server's OpenAI-compatible completions API at ``api_url`` (the key from
    ``OPENAI_API_KEY``, ``"EMPTY"`` if unset); ``model_name`` None: the server's first
    model. The target's log-probabilities are the prompt log-probabilities of
    ``input_prompt + target_str`` (``prompt_logprobs=0``), its last ``t`` tokens."""

    def __init__(self, api_url: str, model_name: str | None = None) -> None:
        try:
            from openai import OpenAI
        except ImportError as exc:
            raise ImportError("VLLMProvider talks to the server through the 'openai' "
                              "package: pip install openai") from exc
        if not api_url.strip():
            raise ValueError("API URL is required: give api_url, the server's address")
        self.api_url = api_url
        try:
            self.client = OpenAI(base_url=api_url, api_key=os.getenv("OPENAI_API_KEY",
                                                                     "EMPTY"))
            if model_name is None:
                models = self.client.models.list().data
                if not models:
                    raise ValueError("No models available from the vLLM API")
                model_name = models[0].id
                logger.info("VLLMProvider: no model_name given, using %s", model_name)
            self.model_name = model_name
        except ValueError:
            raise
        except ConnectionError as exc:
            raise ConnectionError(f"Failed to connect to vLLM API: {exc}") from exc
        except Exception as exc:
            raise ProviderError(f"Unexpected error while initializing vLLM provider: {exc}") \
                from exc

    @staticmethod
    def _choices(response):
        if not getattr(response, "choices", None):
            raise KeyError("API response missing expected 'choices' data")
        return response.choices

    def generate(self, prompt: str, **gen_args) -> str:
        """The server's completion of ``prompt``; ``max_new_tokens`` is read as the API's
        ``max_tokens`` (25 by default), ``do_sample`` dropped."""
        if "max_tokens" not in gen_args:
            gen_args["max_tokens"] = gen_args.pop("max_new_tokens", 25)
        gen_args.pop("do_sample", None)
        try:
            response = self.client.completions.create(model=self.model_name, prompt=prompt,
                                                      **gen_args)
            return self._choices(response)[0].text
        except KeyError:
            raise
        except ConnectionError as exc:
            raise ConnectionError(f"Failed to connect to vLLM API: {exc}") from exc
        except Exception as exc:
            raise ProviderError(f"Unexpected error during text generation: {exc}") from exc

    def get_logprobs(self, input_prompt: str, target_str: str, tokenizer=None) -> list:
        if tokenizer is None:
            raise ValueError("Tokenizer is required for vLLM provider (it counts the "
                             "target's tokens)")
        if not target_str:
            raise ValueError("Target string cannot be empty")
        n = len(tokenizer.encode(target_str, add_special_tokens=False))
        try:
            response = self.client.completions.create(
                model=self.model_name, prompt=input_prompt + target_str, temperature=0.0,
                max_tokens=1, extra_body={"prompt_logprobs": 0})
            choice = self._choices(response)[0]
            if not getattr(choice, "prompt_logprobs", None):
                raise KeyError("API response missing 'prompt_logprobs' data")
            values = []
            try:
                for probs in choice.prompt_logprobs[-n:]:
                    if not probs:
                        raise ValueError("Empty probability data in API response")
                    if len(probs) != 1:
                        raise ValueError("Expected exactly one token in logprobs")
                    values.append(next(iter(probs.values()))["logprob"])
            except (IndexError, KeyError) as exc:
                raise IndexError(f"Unexpected format in log probability data: {exc}") \
                    from exc
            if len(values) != n:
                raise ValueError(f"Not enough logprobs received: expected {n}, got "
                                 f"{len(values)}")
            return values
        except (KeyError, IndexError, ValueError):
            raise
        except ConnectionError as exc:
            raise ConnectionError(f"Failed to connect to vLLM API when getting logprobs: "
                                  f"{exc}") from exc
        except Exception as exc:
            raise ProviderError(f"Unexpected error while getting log probabilities: {exc}") \
                from exc


class _PlaceholderModel:
    """The forward of a method that runs on a remote model: never called (the provider
    gives the outputs), on the CPU."""

    device = torch.device("cpu")

    def __call__(self, *args, **kwargs) -> int:
        return 0


class RemoteLLMAttribution(LLMAttribution):
    """:class:`~taylorattr.captum.attr.LLMAttribution` on a ``provider``'s
    log-probabilities; build the method on ``RemoteLLMAttribution.placeholder_model``
    (e.g. ``FeatureAblation(RemoteLLMAttribution.placeholder_model)``)."""

    placeholder_model = _PlaceholderModel()

    def __init__(self, attr_method, tokenizer, provider: RemoteLLMProvider,
                 attr_target: str = "log_prob") -> None:
        super().__init__(attr_method, tokenizer, attr_target)
        self.provider = provider

    def _prompt(self, model_input) -> str:
        if isinstance(model_input, torch.Tensor):
            return self.tokenizer.decode(model_input.flatten())
        return model_input

    def _target_tokens(self, inp, target, gen_args) -> torch.Tensor:
        if target is not None or not callable(getattr(self.provider, "generate", None)):
            if target is None:
                raise ValueError("the provider has no generate(): give target")
            return super()._target_tokens(inp, target, gen_args)
        if not isinstance(inp, self._inputs):
            raise TypeError(f"{type(self).__name__} takes inputs of "
                            f"{[c.__name__ for c in self._inputs]}, got {type(inp).__name__}")
        text = self.provider.generate(self._prompt(inp.to_model_input()),
                                      **dict(gen_args or DEFAULT_GEN_ARGS))
        return self.tokenizer.encode(text, return_tensors="pt", add_special_tokens=False)[0]

    def _target_log_probs(self, inp, z, target, in_tokens: bool):
        prompt = self._prompt(inp.to_model_input(z))
        values = self.provider.get_logprobs(input_prompt=prompt,
                                            target_str=self.tokenizer.decode(target),
                                            tokenizer=self.tokenizer)
        if len(values) != len(target):
            raise ValueError(f"Number of token logprobs from provider ({len(values)}) does "
                             f"not match expected target token length ({len(target)})")
        return prompt, torch.tensor(values, dtype=torch.float64, device="cpu")
