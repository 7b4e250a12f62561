"""python/shardopt/_torch_state.py — optimizer state dicts between shardopt's layout (flat float32 arrays, integer steps, param names) and torch.optim's (shaped tensors, tensor steps, only the algorithm's keys)."""
import copy

import numpy as np
import torch

from ._shardopt import Algorithm
from ._torch_options import HYPER_KEYS, STATE_KEYS, hyperparams_of


def to_torch(shardopt_dict, params, param_groups, algorithm):
    """torch.optim's state_dict() from shardopt's consolidated dict: `params` in index order,
    `param_groups` the drop-in's (every key kept, as torch does)."""
    state = {}
    for index, entry in sorted(shardopt_dict["state"].items()):
        step = int(entry["step"])
        if step == 0:
            continue  # torch keeps no state for a param that never stepped
        p = params[index]
        out = {}
        if algorithm != Algorithm.sgd:
            out["step"] = torch.tensor(float(step))
        for key in STATE_KEYS[algorithm]:
            if key in entry and isinstance(entry[key], dict):
                out[key] = q8_to_torch(entry[key], p)
            elif key in entry:
                out[key] = torch.from_numpy(np.array(entry[key], dtype=np.float32)).reshape(p.shape).to(p.device)
        if algorithm == Algorithm.sgd and "momentum_buffer" not in out:
            out["momentum_buffer"] = None  # stepped with momentum 0, as torch.optim.SGD records it
        state[index] = out
    groups = []
    start = 0
    for group in param_groups:
        saved = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
        saved["params"] = list(range(start, start + len(group["params"])))
        start += len(group["params"])
        groups.append(saved)
    return {"state": state, "param_groups": groups}


def from_torch(torch_dict, params, param_groups, names, algorithm):
    """shardopt's dict for load_state_dict() from torch.optim's (torch.optim.Adam's, or torch's
    ZeroRedundancyOptimizer's consolidated one), checked as torch checks it. Returns it with the
    saved groups' values (the drop-in's param_groups take them, as torch's load does)."""
    saved_groups = torch_dict["param_groups"]
    if len(saved_groups) != len(param_groups):
        raise ValueError("loaded state dict has a different number of parameter groups")
    if any(len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, param_groups)):
        raise ValueError("loaded state dict contains a parameter group that doesn't match the size of optimizer's group")
    # The saved ids, in order, name our params in order (torch's own mapping).
    index_of = {}
    for s in saved_groups:
        for saved_id in s["params"]:
            index_of[saved_id] = len(index_of)
    state = {}
    for saved_id, entry in torch_dict["state"].items():
        if saved_id not in index_of:
            continue  # torch ignores state of ids no group names
        index = index_of[saved_id]
        p = params[index]
        out = {}
        for key, value in entry.items():
            if key == "step":
                continue
            if key not in STATE_KEYS[algorithm]:
                raise ValueError(f"load_state_dict: state '{key}' of parameter {saved_id} is not {algorithm.name}'s")
            if value is None:
                continue  # SGD's momentum_buffer before momentum was used
            if is_q8(value):
                out[key] = q8_from_torch(value, key, saved_id, p)
                continue
            if value.numel() != p.numel():
                raise ValueError(
                    f"load_state_dict: '{key}' of parameter {saved_id} has {value.numel()} elements, "
                    f"the parameter {p.numel()}"
                )
            out[key] = value.detach().to("cpu", torch.float32).reshape(-1).contiguous().numpy()
        if "step" in entry:
            step = entry["step"]
            out["step"] = int(step.item()) if torch.is_tensor(step) else int(step)
        else:
            out["step"] = 1  # SGD keeps no step; a param with state has stepped
        state[index] = out
    groups = []
    new_groups = []
    start = 0
    for s, g in zip(saved_groups, param_groups):
        merged = {k: copy.deepcopy(v) for k, v in s.items() if k != "params"}
        merged["params"] = g["params"]
        new_groups.append(merged)
        entry = {key: getattr_hyper(hyperparams_of(merged, algorithm), key) for key in HYPER_KEYS[algorithm]}
        entry["params"] = list(range(start, start + len(g["params"])))
        start += len(g["params"])
        groups.append(entry)
    shardopt_dict = {"algorithm": algorithm.name, "param_names": list(names), "state": state, "param_groups": groups}
    return shardopt_dict, new_groups


def getattr_hyper(h, key):
    if key == "betas":
        return (h.beta1, h.beta2)
    return getattr(h, key)


# 8-bit moments (state_precision="q8") travel as torchao's OptimState8bit holds them: codes
# (uint8, the parameter's shape), scale (float32, the absmax of each block of 256 elements),
# qmap (the 256-entry dynamic map) and signed (exp_avg signed, exp_avg_sq unsigned).
Q8_FIELDS = ("codes", "scale", "qmap", "signed")


def is_q8(value):
    """An OptimState8bit (or anything with its attributes), or a dict of its fields."""
    if isinstance(value, dict):
        return all(k in value for k in Q8_FIELDS)
    return all(hasattr(value, k) for k in Q8_FIELDS)


def q8_to_torch(fields, p):
    """torchao's OptimState8bit where torchao is importable and the blocks are whole (it derives
    its block size as codes.numel() // scale.numel()); otherwise a dict of the same fields."""
    codes = torch.from_numpy(np.array(fields["codes"], dtype=np.uint8)).reshape(p.shape).to(p.device)
    scale = torch.from_numpy(np.array(fields["scale"], dtype=np.float32)).to(p.device)
    qmap = torch.from_numpy(np.array(fields["qmap"], dtype=np.float32)).to(p.device)
    signed = bool(fields["signed"])
    if p.numel() % 256 == 0:
        try:
            from torchao.optim.subclass_8bit import OptimState8bit
        except ImportError:
            OptimState8bit = None
        if OptimState8bit is not None:
            return OptimState8bit(codes, scale, qmap, signed)
    return {"codes": codes, "scale": scale, "qmap": qmap, "signed": signed}


def q8_from_torch(value, key, saved_id, p):
    """shardopt's fields (flat numpy arrays) of an OptimState8bit or a dict of its fields."""
    get = (lambda k: value[k]) if isinstance(value, dict) else (lambda k: getattr(value, k))
    codes = get("codes")
    if codes.numel() != p.numel():
        raise ValueError(
            f"load_state_dict: 8-bit '{key}' of parameter {saved_id} has {codes.numel()} codes, the parameter {p.numel()}"
        )
    flat = lambda t, dtype: t.detach().to("cpu", dtype).reshape(-1).contiguous().numpy()
    return {"codes": flat(codes, torch.uint8), "scale": flat(get("scale"), torch.float32),
            "qmap": flat(get("qmap"), torch.float32), "signed": bool(get("signed"))}
