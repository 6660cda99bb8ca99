"""Several llama-servers of one model behind one profile: which server a call goes to.

Pure and synchronous: what each server is expected to hold in its prompt cache
(``holdings.py``), each server's view as the gateway last saw it
(``server_state.py``) and the choice itself (``routing.py``). The caller starts
and probes the servers, sends the call and reports each answer back; nothing here
does I/O or awaits. Each decision looks at every server once and at one
conversation's entry on each, whatever the number of conversations.
"""
