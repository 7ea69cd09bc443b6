"""raipack: build and check model packages for AMD Ryzen AI NPUs."""

__version__ = "0.1.0"
