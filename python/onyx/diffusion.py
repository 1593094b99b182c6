"""onyx.diffusion — images from a diffusers UNet2DModel folder that onyx (or diffusers) trained,
as `onyx sample` makes them (src/diffusion/sampler.h): diffusers' DDPMPipeline / DDIMPipeline
loop in onyx's C++ runtime, class labels passed to a class-conditional UNet.

    images = onyx.diffusion.sample("build/fashion-diffusion", class_labels=[0, 1, 2],
                                   scheduler="ddim", num_inference_steps=50, seed=0)
    onyx.diffusion.to_pil(images)[0].save("first.png")   # needs Pillow

Training is `onyx train` on the folder (docs/DIFFUSION.md).
"""
from . import _onyx

__all__ = ["sample", "to_pil"]


def sample(model, class_labels=None, num_images=1, scheduler=None, num_inference_steps=None,
           batch_size=64, seed=0, scheduler_config=None, encoder_hidden_states=None,
           negative_encoder_hidden_states=None, guidance_scale=1.0, eta=0.0, prompt=None,
           negative_prompt=None, num_images_per_prompt=1, text_encoder=None, tokenizer=None,
           vae=None, use_karras_sigmas=False):
    """Images (N, C, H, W) float32 in [0, 1] as a numpy array. `class_labels`: one per image for
    a class-conditional UNet (then num_images is their number). `scheduler`: the folder's (its
    scheduler config's _class_name, as diffusers' pipelines step with it; DDPM when it names
    none), or "ddpm", "ddim" (with `eta`, DDIMPipeline's: 0 deterministic, 1 DDPM's noise),
    "dpmsolver" (DPMSolverMultistepScheduler), "euler", "euler_ancestral"
    (Euler(Ancestral)DiscreteScheduler), "heun" (HeunDiscreteScheduler), "lms"
    (LMSDiscreteScheduler), "pndm" (PNDMScheduler) or "unipc" (UniPCMultistepScheduler);
    `use_karras_sigmas`: dpmsolver, euler, heun, lms or unipc on Karras sigmas
    ("DPM++ 2M Karras"), as from_config(config, use_karras_sigmas=True) makes them. `num_inference_steps` defaults to the pipelines' (DDPM
    1000, the others 50). `scheduler_config`: a scheduler_config.json (default: the folder's,
    else DDPMScheduler's defaults). A
    UNet2DConditionModel takes `encoder_hidden_states` (N, S, D) float32 (the text encoder's
    output per image), and with guidance_scale > 1 `negative_encoder_hidden_states` (the empty or
    negative prompt's) for classifier-free guidance — or `prompt` (a string or a list of them),
    encoded as StableDiffusionPipeline encodes it by the folder's text_encoder/ and tokenizer/
    (onyx train's output of text-to-image training, or the pipeline's beside the UNet folder; or
    the `text_encoder` and `tokenizer` folders given), `num_images_per_prompt` images each, with
    `negative_prompt` ("" by default) as guidance's unconditional side. A latent model's images
    are decoded by `vae` (an AutoencoderKL folder; default the folder's vae/ or its pipeline's;
    "none": the latents themselves)."""
    import numpy as np

    def arr(x):
        return None if x is None else np.ascontiguousarray(x, dtype=np.float32)
    return _onyx.diffusion_sample(str(model), scheduler or "", int(num_inference_steps or 0),
                                  int(num_images), [int(c) for c in (class_labels or [])],
                                  int(batch_size), int(seed), str(scheduler_config or ""),
                                  arr(encoder_hidden_states), arr(negative_encoder_hidden_states),
                                  float(guidance_scale), float(eta),
                                  [prompt] if isinstance(prompt, str) else list(prompt or []),
                                  str(negative_prompt or ""), int(num_images_per_prompt),
                                  str(text_encoder or ""), str(tokenizer or ""), str(vae or ""),
                                  bool(use_karras_sigmas))


def to_pil(images):
    """PIL images of sample()'s output, as diffusers' numpy_to_pil (round(x * 255))."""
    import numpy as np
    from PIL import Image
    arr = (np.asarray(images).transpose(0, 2, 3, 1) * 255).round().astype("uint8")
    if arr.shape[-1] == 1:
        return [Image.fromarray(a[..., 0], mode="L") for a in arr]
    return [Image.fromarray(a) for a in arr]
