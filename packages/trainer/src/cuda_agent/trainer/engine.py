"""Training engines: plain torch through accelerate (device placement, DDP, mixed precision)
or DeepSpeed ZeRO-2/3 from a JSON config.

The trainer drives every engine the same way: for each micro-batch ``backward(loss, last)``
(gradients are synchronised across data-parallel ranks on the last one), then ``step()``
once per optimiser update. Losses arrive already divided by the mini-batch's global
token count; engines neither average over micro-batches nor rescale.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from cuda_agent.core.errors import ConfigError


@dataclass
class EngineOptions:
    """``trainer.engine``: the defaults are the paper's preset, and the trainer's config
    fragment is made from them (CPU runs set ``mixed_precision: 'no'``, as configs/toy.yaml does)."""

    backend: str = "auto"  # auto | deepspeed | accelerate  (auto: deepspeed when installed and on CUDA)
    zero_stage: int = 3  # 2 or 3 (deepspeed)
    ds_config: str | None = None  # a DeepSpeed JSON file replacing the packaged zero2/zero3 one
    mixed_precision: str = "bf16"  # no | bf16 | fp16
    device: str = "auto"  # auto | cpu | cuda
    gradient_checkpointing: bool = True
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    # 0: every parameter trains; N: only the top N decoder layers, the final norm and a value
    # head (embeddings, tied output head and lower layers frozen: a small CPU budget)
    train_layers: int = 0


def deepspeed_available() -> bool:
    try:
        import deepspeed  # noqa: F401
    except Exception:
        return False
    return True


def resolve_backend(options: EngineOptions) -> str:
    b = options.backend
    if b not in ("auto", "deepspeed", "accelerate"):
        raise ConfigError(f"trainer.engine.backend={b!r}; valid: auto, deepspeed, accelerate")
    if b == "auto":
        return "deepspeed" if deepspeed_available() and torch.cuda.is_available() else "accelerate"
    if b == "deepspeed" and not deepspeed_available():
        raise ConfigError("trainer.engine.backend=deepspeed but deepspeed is not installed "
                          "(pip install deepspeed, or set trainer.engine.backend=accelerate)")
    return b


def resolve_device(options: EngineOptions) -> torch.device:
    if options.device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    if options.device == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(options.device)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_distributed(backend: str | None = None) -> None:
    """Initialise torch.distributed from the launcher's variables (one process when absent)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend=backend)


def world_size() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def all_reduce_sum(value: float, device: torch.device | None = None) -> float:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return float(value)
    backend = str(dist.get_backend())
    if "gloo" in backend and "nccl" not in backend:
        dev = torch.device("cpu")
    elif device is not None:
        dev = device
    else:
        # NCCL reduces device tensors only: use this rank's current GPU
        dev = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([float(value)], dtype=torch.float64, device=dev)
    dist.all_reduce(t)
    return float(t.item())


def load_ds_config(options: EngineOptions, max_grad_norm: float) -> dict:
    if options.ds_config:
        path = Path(options.ds_config)
        if not path.exists():
            raise ConfigError(f"trainer.engine.ds_config not found: {path}")
        cfg = json.loads(path.read_text())
    else:
        if options.zero_stage not in (2, 3):
            raise ConfigError(f"trainer.engine.zero_stage={options.zero_stage}; valid: 2, 3")
        name = f"configs/ds_zero{options.zero_stage}.json"
        cfg = json.loads(resources.files("cuda_agent.trainer").joinpath(name).read_text())

    def fill(node: dict, key: str, value: Any) -> None:
        if node.get(key, "auto") == "auto":
            node[key] = value

    fill(cfg, "train_micro_batch_size_per_gpu", 1)
    fill(cfg, "gradient_clipping", float(max_grad_norm or 0.0))
    cfg["gradient_accumulation_steps"] = 1
    bf16 = cfg.setdefault("bf16", {})
    fill(bf16, "enabled", options.mixed_precision == "bf16")
    if options.mixed_precision == "fp16":
        cfg.setdefault("fp16", {"enabled": True})
    cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] * world_size()
    cfg["zero_allow_untested_optimizer"] = True
    return cfg


class ModelEngine:
    """One trainable model with its optimiser."""

    backend = "base"

    def __init__(self, model: torch.nn.Module, lr: float, max_grad_norm: float, options: EngineOptions):
        self.options = options
        self.lr = lr
        self.max_grad_norm = max_grad_norm
        self.device = resolve_device(options)
        if options.gradient_checkpointing:
            target = getattr(model, "backbone", model)
            for name in ("activation_checkpointing_enable", "gradient_checkpointing_enable"):
                if hasattr(target, name):
                    getattr(target, name)()
                    break

    def _optimizer(self, params) -> torch.optim.Optimizer:
        o = self.options
        return torch.optim.AdamW(params, lr=self.lr, betas=tuple(o.adam_betas), eps=o.adam_eps,
                                 weight_decay=o.weight_decay)

    def set_lr(self, lr: float) -> None:
        self.lr = lr
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)


class AccelerateEngine(ModelEngine):
    """torch + accelerate: DDP across the launcher's processes, autocast mixed precision."""

    backend = "accelerate"

    def __init__(self, model: torch.nn.Module, lr: float, max_grad_norm: float, options: EngineOptions):
        super().__init__(model, lr, max_grad_norm, options)
        from accelerate import Accelerator

        cpu = self.device.type == "cpu"
        self.accelerator = Accelerator(mixed_precision=options.mixed_precision if not cpu else "no", cpu=cpu)
        self.device = self.accelerator.device
        opt = self._optimizer(model.parameters())
        self.model, self.optimizer = self.accelerator.prepare(model, opt)
        self.module = self.accelerator.unwrap_model(self.model)
        self._sync_ctx = None

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        if last or self.accelerator.num_processes == 1:
            self.accelerator.backward(loss)
        else:
            with self.accelerator.no_sync(self.model):
                self.accelerator.backward(loss)

    def step(self) -> float:
        norm = None
        if self.max_grad_norm and self.max_grad_norm > 0:
            norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        else:
            norm = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in self.model.parameters() if p.grad is not None))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm) if norm is not None else float("nan")

    def full_state_dict(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()}

    def save_state(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if rank() == 0:
            torch.save(self.optimizer.state_dict(), path / "optimizer.pt")

    def load_state(self, path: str | Path) -> None:
        f = Path(path) / "optimizer.pt"
        if f.exists():
            self.optimizer.load_state_dict(torch.load(f, map_location=self.device, weights_only=False))

    def load_weights(self, state_dict: dict) -> None:
        self.module.load_state_dict(state_dict)


class DeepSpeedEngine(ModelEngine):
    """DeepSpeed ZeRO-2/3 on one model (a JSON config, the packaged one by default)."""

    backend = "deepspeed"

    def __init__(self, model: torch.nn.Module, lr: float, max_grad_norm: float, options: EngineOptions):
        super().__init__(model, lr, max_grad_norm, options)
        import deepspeed

        if self.device.type == "cpu":
            # the shared-memory collective is a JIT-built C++ op: on the CPU gloo is enough
            try:
                deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
            except Exception:
                pass
        ensure_distributed("nccl" if self.device.type == "cuda" else "gloo")
        self.ds_config = load_ds_config(options, max_grad_norm)
        model = model.to(self.device)
        opt = self._optimizer(model.parameters())
        self.model, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=self.ds_config)
        self.module = self.model.module
        self.zero_stage = int(self.ds_config.get("zero_optimization", {}).get("stage", 0))

    def backward(self, loss: torch.Tensor, last: bool = True) -> None:
        self.model.set_gradient_accumulation_boundary(bool(last))
        self.model.backward(loss)

    def step(self) -> float:
        self.model.set_gradient_accumulation_boundary(True)
        self.model.step()
        norm = self.model.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def set_lr(self, lr: float) -> None:
        self.lr = lr
        for g in self.model.optimizer.param_groups:
            g["lr"] = lr

    def full_state_dict(self) -> dict:
        if self.zero_stage == 3:
            sd = self.model._zero3_consolidated_16bit_state_dict()
            return {k: v.detach().cpu() for k, v in (sd or {}).items()}
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()}

    def save_state(self, path: str | Path) -> None:
        self.model.save_checkpoint(str(path), tag="ds", save_latest=False)

    def load_state(self, path: str | Path) -> None:
        if (Path(path) / "ds").exists():
            self.model.load_checkpoint(str(path), tag="ds", load_module_strict=True)

    def load_weights(self, state_dict: dict) -> None:
        if self.zero_stage == 3:
            import deepspeed

            params = list(self.module.parameters())
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                if rank() == 0:
                    self.module.load_state_dict(state_dict, strict=False)
        else:
            self.module.load_state_dict(state_dict)


def train_top_layers(model: torch.nn.Module, n: int) -> int:
    """Freeze all but the top ``n`` decoder layers (the model's first ``layers`` list), the
    parameters outside it and outside the embeddings (final norm, value head); returns how many
    parameters still train."""
    layers = next((m for name, m in model.named_modules()
                   if isinstance(m, torch.nn.ModuleList) and name.split(".")[-1] == "layers"), None)
    if layers is None:
        raise ConfigError("trainer.engine.train_layers: the model has no decoder `layers` list")
    frozen = {id(p) for layer in list(layers)[: max(0, len(layers) - n)] for p in layer.parameters()}
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            frozen |= {id(p) for p in m.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) not in frozen)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def build_engine(model: torch.nn.Module, lr: float, max_grad_norm: float, options: EngineOptions) -> ModelEngine:
    if options.train_layers:
        train_top_layers(model, int(options.train_layers))
    backend = resolve_backend(options)
    if backend == "deepspeed":
        return DeepSpeedEngine(model, lr, max_grad_norm, options)
    return AccelerateEngine(model, lr, max_grad_norm, options)
