"""python/shardopt/_torch_options.py — torch.optim classes and their options, mapped onto shardopt's algorithms and Hyperparams (refusing what shardopt cannot do)."""
import torch

from ._shardopt import Algorithm, Hyperparams

# The torch.optim classes the drop-in runs, and shardopt's algorithm for each.
SUPPORTED_CLASSES = {
    torch.optim.SGD: Algorithm.sgd,
    torch.optim.Adam: Algorithm.adam,
    torch.optim.AdamW: Algorithm.adamw,
}
if hasattr(torch.optim, "Muon"):  # torch 2.9 and later: each matrix owned whole by one rank
    SUPPORTED_CLASSES[torch.optim.Muon] = Algorithm.muon

# Muon's own group keys (torch.optim.Muon's names), passed to shardopt as they are.
MUON_KEYS = ("ns_coefficients", "ns_steps", "adjust_lr_fn")

# The group keys each algorithm reads (torch's names).
HYPER_KEYS = {
    Algorithm.sgd: ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
    Algorithm.adam: ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
    Algorithm.adamw: ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"),
    Algorithm.muon: ("lr", "weight_decay", "momentum", "nesterov", "eps") + MUON_KEYS,
}

# The state keys torch's optimizer of each algorithm keeps per parameter (besides "step").
STATE_KEYS = {
    Algorithm.sgd: ("momentum_buffer",),
    Algorithm.adam: ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    Algorithm.adamw: ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    Algorithm.muon: ("momentum_buffer",),
}

# Options that only choose torch's implementation (loops, foreach or fused kernels), not the
# result: shardopt always runs its own fused kernels, so any value is accepted.
IMPLEMENTATION_KEYS = ("foreach", "fused")


def class_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}" if cls.__module__ != "torch.optim" else f"torch.optim.{cls.__name__}"


def algorithm_for(optimizer_class):
    """shardopt's algorithm for a torch.optim class; ValueError listing the supported ones otherwise."""
    algorithm = SUPPORTED_CLASSES.get(optimizer_class)
    if algorithm is None:
        supported = ", ".join(f"torch.optim.{c.__name__}" for c in SUPPORTED_CLASSES)
        name = class_name(optimizer_class) if isinstance(optimizer_class, type) else repr(optimizer_class)
        raise ValueError(
            f"shardopt.torch.ZeroRedundancyOptimizer: optimizer_class {name} is not supported; "
            f"supported: {supported}"
        )
    return algorithm


def torch_defaults(optimizer_class, defaults):
    """The complete defaults torch's class has with these keyword arguments (torch checks their
    values, e.g. a negative lr, with its own messages), and with none but lr: the values an
    option shardopt does not implement must keep."""
    # A 1 x 1 matrix: every class takes it (Muon refuses what is not 2-D).
    given = optimizer_class([torch.zeros(1, 1, requires_grad=True)], **defaults).defaults
    lr_only = {"lr": defaults["lr"]} if "lr" in defaults else {}
    pristine = optimizer_class([torch.zeros(1, 1, requires_grad=True)], **lr_only).defaults
    return dict(given), dict(pristine)


def check_group(group, algorithm, reference):
    """Refuses an option value shardopt cannot honour, naming it. `reference`: torch's own
    defaults for the class; an option outside HYPER_KEYS must keep its default value."""
    for key, default in reference.items():
        if key in HYPER_KEYS[algorithm] or key in IMPLEMENTATION_KEYS or key not in group:
            continue
        if group[key] != default:
            raise ValueError(
                f"shardopt.torch.ZeroRedundancyOptimizer: {key}={group[key]!r} is not supported "
                f"(shardopt runs {algorithm.name} with {key}={default!r} only)"
            )


def to_float(value):
    return float(value.item()) if torch.is_tensor(value) else float(value)


def hyperparams_of(group, algorithm):
    """shardopt's Hyperparams for a torch param-group dict (the keys the algorithm reads)."""
    h = Hyperparams()
    h.lr = to_float(group["lr"])
    h.weight_decay = float(group.get("weight_decay", 0.0))
    h.maximize = bool(group.get("maximize", False))
    if algorithm == Algorithm.muon:
        h.momentum = float(group.get("momentum", 0.95))
        h.nesterov = bool(group.get("nesterov", True))
        h.eps = float(group.get("eps", 1e-7))
    elif algorithm == Algorithm.sgd:
        h.momentum = float(group.get("momentum", 0.0))
        h.dampening = float(group.get("dampening", 0.0))
        h.nesterov = bool(group.get("nesterov", False))
    else:
        beta1, beta2 = group.get("betas", (0.9, 0.999))
        h.beta1, h.beta2 = to_float(beta1), to_float(beta2)
        h.eps = float(group.get("eps", 1e-8))
        h.amsgrad = bool(group.get("amsgrad", False))
    return h
