"""fc_mnist (MLP on 28x28 digits); its `wafer.registry.ModelSpec` is in `models.registry`."""

from models.fc_mnist.model import FCMnist as FCMnist
from models.fc_mnist.model import FCMnistConfig as FCMnistConfig
from models.fc_mnist.model import fc_mnist_loss as fc_mnist_loss

__all__ = ("FCMnist", "FCMnistConfig", "fc_mnist_loss")
