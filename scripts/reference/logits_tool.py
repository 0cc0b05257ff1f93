"""What scripts/reference/llamacpp_logits.cpp prints, read back: per prompt, the top-k
(token, logit) pairs at every position and the greedy continuation."""


def parse(stdout, prompts):
    """`stdout`: the tool's lines ("S gen T..." or "S top T:L..."); `prompts`: how many."""
    top, gen = [[] for _ in range(prompts)], [[] for _ in range(prompts)]
    for l in stdout.splitlines():
        parts = l.split()
        s = int(parts[0])
        if parts[1] == 'gen':
            gen[s] = [int(t) for t in parts[2:]]
        else:
            top[s].append([[int(x.split(':')[0]), float(x.split(':')[1])] for x in parts[2:]])
    return top, gen
