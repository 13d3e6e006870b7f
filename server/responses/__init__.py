"""OpenAI's Responses API (/v1/responses): request.py and items.py translate
a request into one GenerationRequest, frames.py writes the response object
and its typed events, store.py keeps stored responses, routes.py serves them."""
