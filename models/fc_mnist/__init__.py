"""fc_mnist (MLP on 28x28 digits); registers its ``model:`` schema as ``fc_mnist``."""

from models.fc_mnist.model import FCMnist as FCMnist
from models.fc_mnist.model import FCMnistConfig as FCMnistConfig
from models.fc_mnist.model import fc_mnist_loss as fc_mnist_loss
from wafer.config import register_model_schema

register_model_schema("fc_mnist", FCMnistConfig)

__all__ = ("FCMnist", "FCMnistConfig", "fc_mnist_loss")
