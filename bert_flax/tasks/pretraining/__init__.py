"""Pre-training: masked-LM + NSP (`task.py`); its data pipeline is `bert_flax.data`, its model
`bert_flax.model.bert.BertForPreTraining`, its losses `bert_flax.model.losses`."""

from bert_flax.tasks.pretraining.task import PreTrainingTask

__all__ = ["PreTrainingTask"]
