"""The inference engine: model runner, paged KV cache, radix cache, scheduler, TP workers."""
