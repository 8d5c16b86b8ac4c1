"""BERT pre-training (MLM + NSP); registers its ``model:`` schema as ``bert``."""

from models.bert.model import BertConfig as BertConfig
from models.bert.model import BertForPreTraining as BertForPreTraining
from models.bert.model import BertLayer as BertLayer
from models.bert.model import bert_loss as bert_loss
from models.bert.model import random_batch as random_batch
from wafer.config import register_model_schema

register_model_schema("bert", BertConfig)

__all__ = ("BertConfig", "BertForPreTraining", "BertLayer", "bert_loss", "random_batch")
