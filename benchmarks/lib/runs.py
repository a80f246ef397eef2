"""The blocks of published training runs (`python -m benchmarks --publish_run`): the CPU
recipe's runs and `make demo`'s summary."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.lib.records import Read
from benchmarks.lib.render import Columns, items_table, machine_text, source

# Its blocks in the docs, rendered from its results files (`python -m benchmarks --docs`).


CPU_RUNS = {"cpu_pretrain_soap": "SOAP", "cpu_pretrain": "AdamW"}


def cpu_pretrain_row(read: Read) -> tuple[str, str]:
    finals = {name: read(name)["result"] for name in CPU_RUNS}
    reached = ", ".join(
        f"{final['eval']['masked_lm_accuracy']:.3f} with {CPU_RUNS[name]}"
        for name, final in finals.items()
    )
    baseline = finals["cpu_pretrain_soap"]["baseline"]
    return "CPU pre-training past the plateau (2 cores, 15 min, packed)", (
        f"eval masked-LM accuracy {reached} (most-frequent-token baseline {baseline:.3f})"
    )


def cpu_pretrain_block(name: str) -> Callable[[Read], str]:
    """The block of one run of the CPU recipe (`CPU_RUNS`): where it ended."""
    columns: Columns = {
        "optimizer": lambda final: CPU_RUNS[name],
        "steps": lambda final: f"{final['step']:,}",
        "sequences": lambda final: f"{final['sequences_seen']:,}",
        "training seconds": lambda final: final["train_seconds"],
        "eval masked-LM accuracy": lambda final: final["eval"]["masked_lm_accuracy"],
        "most-frequent-token baseline": lambda final: final["baseline"],
    }
    return lambda read: f"{source(name, read)}\n\n{items_table([read(name)['result']], columns)}"


def demo_block(read: Read) -> str:
    record = read("demo")
    return (
        f"`make demo`'s summary, one run ({record['date']}, {machine_text(record['machine'])}; "
        f"`benchmarks/results/demo.json`):\n\n```\n{record['result']['summary']}\n```"
    )


BLOCKS: dict[str, Callable[[Read], str]] = {
    "demo": demo_block,
    **{name: cpu_pretrain_block(name) for name in CPU_RUNS},
}
README_ROW = (
    cpu_pretrain_row,
    "`python -m bert_flax.train --config=configs/cpu_pretrain_soap.py "
    "--workdir=workdir/cpu_soap --config.data.data_dir=workdir/sotu_cpu` "
    "([results](docs/results.md#the-cpu-pre-training-recipe))",
)  # its row of the README's headline table
