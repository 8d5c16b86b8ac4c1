"""Reference Flax NNX models (fc_mnist, BERT, GPT-2/3) with modelzoo-style params YAML.

Empty until the reference-models milestone; models will register here by name.
"""

__all__ = ()
