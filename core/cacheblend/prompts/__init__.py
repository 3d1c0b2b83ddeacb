"""The request path before the model: the prompt text, its one tokenization, chunk finding, assembly.

``request.py`` turns a request (a raw prompt, or chunks + query + prefix through the chat
template) into the prompt text and the spans of its chunks; ``finder.py`` finds warmed chunk texts
inside a prompt; ``tokenize.py`` tokenizes the prompt once, exactly as the model's tokenizer does,
and chunks as they appear in prompts; ``assemble.py`` maps chunk tokens to prompt tokens and joins
the stores' KV into a ``BlendInput``.
"""
