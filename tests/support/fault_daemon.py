"""A real fanfs mount served in the foreground with a fault injected into its FUSE front
(tests/test_fuse_faults.py).  Prints ``ready`` once it serves, and the events the test orders.

    fault_daemon.py STORE MNT MODE

``raise-base``   a lookup of the name ``boom`` raises SystemExit (a BaseException, not an Exception)
``reply-fails``  every read is answered by the worker threads, and the first reply they send raises
``slow-peer``    every read is answered by the worker threads after 1.5 s (a peer slow to answer);
                 prints ``reply`` when a worker replies and ``destroyed`` when the session is destroyed
"""

import ctypes
import sys
import time

from fanfs.records import Presentation
from fanfs.serve import fusefs
from fanfs.serve import lowlevel as ll
from fanfs.serve.logfile import setup_logging
from fanfs.store import Store


def say(event: str) -> None:
    print(event, flush=True)


store_root, mountpoint, mode = sys.argv[1:4]
setup_logging(debug=False)
store = Store(store_root, is_local=None if mode == "raise-base" else lambda entry, view: False)
fs = fusefs.FanfsFS(store, Presentation(), lambda: say("ready"))
real_reply = ll.reply_spans

if mode == "raise-base":
    real_lookup = fs.lookup

    def lookup(req, parent, name):
        if name == b"boom":
            raise SystemExit("a BaseException in a request handler")
        real_lookup(req, parent, name)

    fs.lookup = lookup
elif mode == "reply-fails":
    failed = []

    def reply_spans(req, spans):
        if not failed:
            failed.append(1)
            raise ctypes.ArgumentError("injected: the reply could not be sent")
        return real_reply(req, spans)

    ll.reply_spans = reply_spans
elif mode == "slow-peer":
    real_spans = store.spans

    def slow_spans(*args):
        time.sleep(1.5)
        return real_spans(*args)

    def reply_spans(req, spans):
        say("reply")
        return real_reply(req, spans)

    real_close = ll.Session.close

    def close(session):
        say("destroyed")
        real_close(session)

    store.spans = slow_spans
    ll.reply_spans = reply_spans
    ll.Session.close = close
sys.exit(fusefs.serve(store, mountpoint, fs))
