from ._problem import Problem


__all__ = ["Problem"]
