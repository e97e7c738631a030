"""Package discovery for setuptools; the rest of the metadata is in pyproject.toml.

pyproject.toml cannot both discover packages (`find`) and list the two folders it maps into
farmkit's namespace (tools/ -> farmkit.tools, schemas/ -> farmkit.schemas): setuptools' `find` does
not follow package-dir. So every package under farmkit/ is found here, data-only folders included
(namespace packages), and the two mapped ones are added.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=find_namespace_packages(include=["farmkit", "farmkit.*"], exclude=["*.__pycache__"])
    + ["farmkit.tools", "farmkit.schemas"]
)
