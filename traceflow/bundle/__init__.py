"""Reading a bundle: the files (reader.py: folders and archives, size limits; foreign/:
other tools' archives such as support bundles), the persistent index (index.py), the
Kubernetes objects (kubecatalog.py, fastyaml.py, validate.py, kube.py), a pod's own files
(podside.py) and the snapshot that parses each node's files on first use (snapshot.py)."""
