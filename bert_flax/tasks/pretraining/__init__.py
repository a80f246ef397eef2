"""Pre-training: masked-LM + NSP (`task.py`); its data pipeline is `bert_flax.data`, its model
`bert_flax.model.BertForPreTraining`, its losses `bert_flax.losses`."""

from bert_flax.tasks.pretraining.task import PreTrainingTask

__all__ = ["PreTrainingTask"]
