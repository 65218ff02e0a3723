"""Docker images: the SDK behind one typed facade (:mod:`.api`), the matrix images and offline
bases, their specs and the staged wheelhouse. Importing this package never imports the SDK."""
