"""The rendezvous store seam: the typed KeyValueStore interface every agent module uses
(kv.py); its implementation over torch's TCPStore with bounded calls (torch_store.py)
and hosting or reaching a TCPStore (opening.py); its implementation over etcd
(etcd_store.py, on etcd_client.py and etcd_watch.py); choosing one (backends.py)."""
