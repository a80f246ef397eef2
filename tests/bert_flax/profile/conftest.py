"""Small programs with known contents for the profiler tests."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest

from bert_flax import profile


class ToyAttention(nn.Module):
    hidden: int
    heads: int

    @nn.compact
    def __call__(self, x, train: bool):
        b, length, _ = x.shape
        d = self.hidden // self.heads

        def project(name):
            return nn.Dense(self.hidden, name=name)(x).reshape(b, length, self.heads, d)

        q, k, v = project("query"), project("key"), project("value")
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / d**0.5
        p = nn.Dropout(0.1)(jax.nn.softmax(s), deterministic=not train)
        c = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, length, self.hidden)
        return nn.Dense(self.hidden, name="output")(c)


class ToyBlock(nn.Module):
    """A post-LN transformer block with the module names of bert_flax."""

    hidden: int = 64
    heads: int = 2

    @nn.compact
    def __call__(self, x, train: bool):
        y = ToyAttention(self.hidden, self.heads, name="attention")(x, train)
        y = nn.LayerNorm(name="attention_layer_norm")(x + y)
        h = nn.gelu(nn.Dense(4 * self.hidden, name="intermediate")(y))
        return nn.LayerNorm(name="ffn_layer_norm")(y + nn.Dense(self.hidden, name="output")(h))


@pytest.fixture(scope="session")
def toy_train_step():
    """(jitted step, args, update) of one AdamW training step of ToyBlock."""
    model = ToyBlock()
    x = jax.random.normal(jax.random.key(0), (4, 64, 64))
    params = model.init(jax.random.key(1), x, False)
    tx = optax.adamw(1e-3)
    opt_state = tx.init(params)

    def step(params, opt_state, x, rng):
        def loss_fn(p):
            y = model.apply(p, x, True, rngs={"dropout": rng})
            return jnp.mean(y**2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(step, donate_argnums=(0, 1))
    return jitted, (params, opt_state, x, jax.random.key(2)), lambda a, o: (o[0], o[1], *a[2:])


@pytest.fixture(scope="session")
def toy_profile(toy_train_step, tmp_path_factory):
    fn, args, update = toy_train_step
    fake = profile.Ceilings(1e10, 1e9, "float32", 256, 2**26)  # not measured: keeps tests fast
    return profile.profile_step(
        fn,
        *args,
        steps=3,
        warmup=1,
        update=update,
        ceilings=fake,
        label="toy",
        logdir=str(tmp_path_factory.mktemp("trace")),
    )
