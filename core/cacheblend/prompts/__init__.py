"""The request path before the model: segments and tokens, chunk finding, assembly with cached KV.

``tokenize.py`` turns a request (a raw prompt, or chunks + query + prefix through the chat
template) into segments and token ids; ``finder.py`` finds warmed chunk texts inside a prompt;
``assemble.py`` joins the segments' ids and the stores' KV into a ``BlendInput``.
"""
