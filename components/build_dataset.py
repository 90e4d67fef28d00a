"""Component: the training dataset from the span store's window."""

from kfp import dsl
from kfp.dsl import Dataset, Output

from components import IMAGE


@dsl.component(base_image=IMAGE)
def build_dataset(
    dataset: Output[Dataset],
    agent: str,
    store_url: str = "",
    since: str = "",
    until: str = "",
    mode: str = "sft",
    min_reward: float = 1.0,
    drop_examples: bool = True,
    max_tokens: int = 0,
    eval_fraction: float = 0.1,
    min_train_rows: int = 1,
    credit: str = "episode",
    feedback_horizon_hours: float = 72.0,
    reward: str = "",
    trusted_producers: str = "",
) -> str:
    """Build the dataset; returns its content hash."""
    from pathlib import Path

    from spanmill.pipeline.steps import build_dataset_step

    card = build_dataset_step(
        Path(dataset.path), store_url=store_url, agent=agent, since=since, until=until,
        mode=mode, min_reward=min_reward, drop_examples=drop_examples, max_tokens=max_tokens,
        eval_fraction=eval_fraction, min_train_rows=min_train_rows, credit=credit,
        feedback_horizon_hours=feedback_horizon_hours, reward=reward,
        trusted_producers=trusted_producers,
    )  # fmt: skip
    dataset.metadata.update(
        {"content_hash": card["content_hash"], "mode": card["mode"], **card["counts"]}
    )
    return str(card["content_hash"])
