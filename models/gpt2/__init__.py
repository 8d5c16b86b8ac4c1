"""GPT-2 / GPT-3-style decoder LM; its `wafer.registry.ModelSpec` is in `models.registry`."""

from models.gpt2.model import GPT2Block as GPT2Block
from models.gpt2.model import GPT2Config as GPT2Config
from models.gpt2.model import GPT2LMHeadModel as GPT2LMHeadModel
from models.gpt2.model import gpt2_loss as gpt2_loss
from models.gpt2.model import random_batch as random_batch

__all__ = ("GPT2Block", "GPT2Config", "GPT2LMHeadModel", "gpt2_loss", "random_batch")
