"""The task state a gateway's calls read and add to: the reasoning store and the history
behind ``changed``, in files and memory or in a PostgreSQL database (``state:``)."""
