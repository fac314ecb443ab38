"""local_sgd or diloco stepping lm-tiny with the language models' AdamW as its inner
optimizer, each worker on its own tokens, meeting after every 2nd step:

    mpiexec -n N python tests/programs/inner_adamw.py STRATEGY

Beside the strategy's model each rank trains a twin alone (the same start, the same
tokens, no strategy). Up to the first meeting both take the same steps, so after it
the strategy's AdamW state must still be the twin's (a meeting averages parameters
only), while the parameters are the workers' shared ones. Rank 0 prints
`INNER <json list, one per rank>` (tests/programs/gathered.py).
"""

import copy
import sys

import torch


def state_of(optimizer):
    """AdamW's moments and step counts, flat, in parameter order."""
    found = {"exp_avg": [], "exp_avg_sq": [], "step": []}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key in found:
                found[key].append(torch.as_tensor(optimizer.state[p][key]).flatten().float())
    return {key: torch.cat(values) for key, values in found.items()}


def main(strategy: str) -> None:
    from commbench import registry
    from commbench.config.run_config import RunConfig
    from commbench.data import batches
    from commbench.job import recipe
    from commbench.job.models import build_model
    from commbench.launch.detect import detect_launch
    from commbench.launch.distributed import init_distributed
    from gathered import print_everyones

    ctx = init_distributed(detect_launch(), no_cuda=True, timeout=120)
    config = RunConfig(model="lm-tiny", dist_optimizer=strategy,
                       options={"average_every": 2})
    torch.manual_seed(0)
    model = build_model("lm-tiny", 256)
    twin = copy.deepcopy(model)
    lm_recipe = recipe.for_speed(config)
    optimizer, alone = lm_recipe.optimizer(model.parameters()), \
        lm_recipe.optimizer(twin.parameters())
    plugin = registry.resolve(strategy)(ctx, config)
    step = plugin.wrap(model, optimizer)
    tokens = batches.synthetic_tokens(2, 16, 256, "cpu", seed=100 + ctx.rank)
    for _ in range(2):
        inputs, labels = tokens.next()
        step(inputs, labels)
        alone.zero_grad()
        torch.nn.functional.cross_entropy(twin(inputs), labels).backward()
        alone.step()
    mine, theirs = state_of(optimizer), state_of(alone)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    outer = getattr(plugin, "outer", None)
    print_everyones("INNER", {
        "adamw": isinstance(optimizer, torch.optim.AdamW),
        "meetings": plugin.facts()["meetings"],
        "state_is_the_twins": all(torch.equal(mine[k], theirs[k]) for k in mine),
        "steps": mine["step"].unique().tolist(),
        "moment_sum": mine["exp_avg"].abs().sum().item(),
        "parameter_sum": flat.double().sum().item(),
        "twin_parameter_sum": torch.cat([p.detach().flatten() for p in twin.parameters()])
        .double().sum().item(),
        "outer": None if outer is None else {
            "name": type(outer).__name__, **{k: outer.param_groups[0][k] for k in
                                             ("lr", "momentum", "nesterov")}},
    }, ctx)


if __name__ == "__main__":
    main(sys.argv[1])
