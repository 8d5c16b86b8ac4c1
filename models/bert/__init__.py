"""BERT pre-training (MLM + NSP); its `wafer.registry.ModelSpec` is in `models.registry`."""

from models.bert.model import BertConfig as BertConfig
from models.bert.model import BertForPreTraining as BertForPreTraining
from models.bert.model import BertLayer as BertLayer
from models.bert.model import bert_loss as bert_loss
from models.bert.model import random_batch as random_batch

__all__ = ("BertConfig", "BertForPreTraining", "BertLayer", "bert_loss", "random_batch")
